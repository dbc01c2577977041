/*
 * capture_guard.c: the open-capture flag and its refusal (capture_guard.h).
 */
#include "engine/capture_guard.h"
#include "engine/error.h"

static bool open_now;
static unsigned serial;   /* captures opened so far */

bool mp_capturing(void) { return open_now; }

unsigned mp_capture_serial(void) { return open_now ? serial : 0; }

void mp_capture_mark(bool open)
{
    open_now = open;
    if (open && ++serial == 0) serial = 1;   /* 0 stays "none" */
}

int mp_capture_refuse(const char *what, const char *why)
{
    if (!open_now) return 0;
    return mp_fail(MP_EINVAL, "cannot %s inside a CUDA graph capture (mp.cuda.graph): %s", what, why);
}
