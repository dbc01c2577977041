/* error.c: the engine's last error, one per thread. */
#include <stdarg.h>
#include <stdio.h>
#include "engine/error.h"

static _Thread_local char msg[512];
static _Thread_local mp_errcode code;

int mp_fail(mp_errcode c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    code = c;
    return -1;
}

const char *mp_error(void) { return msg[0] ? msg : "unknown error"; }
mp_errcode mp_errcode_last(void) { return code; }
void mp_clear_error(void) { msg[0] = 0; code = MP_OK; }
