/*
 * capture_guard.h: whether a graph capture is open, and the one refusal that
 * every op which cannot be recorded makes (engine/capture.h opens and closes
 * captures). Kept apart from capture.h so that the device layer and the ops
 * can ask without depending on the capture machinery, which itself sits on
 * the device layer: the include graph keeps no circle.
 */
#ifndef MP_CAPTURE_GUARD_H
#define MP_CAPTURE_GUARD_H

#include <stdbool.h>

/* whether a capture is open */
bool mp_capturing(void);
/* the open capture's number (different for each capture), 0 when none is:
 * what an op keeps to know whether its backward runs in the capture of its
 * forward (attention's dropout, ops_attention.c) */
unsigned mp_capture_serial(void);
/* when a capture is open: -1 with "cannot <what> inside a CUDA graph capture
 * (mp.cuda.graph): <why>"; else 0 */
int mp_capture_refuse(const char *what, const char *why);
/* capture.c's: a capture opened (true) or closed (false) */
void mp_capture_mark(bool open);

#endif
