/*
 * error.h: how the engine reports a failure.
 *
 * An engine function that fails returns NULL (or -1) after recording a message
 * with mp_fail(). The message says what was wrong with which argument but not
 * which Lua function was called: the binding knows that name and prefixes it
 * ("mp.matmul: " + message). MP_EOOM marks an allocation failure, which the
 * binding answers with a full garbage collection and one retry.
 */
#ifndef MP_ERROR_H
#define MP_ERROR_H

typedef enum { MP_OK, MP_EINVAL, MP_EOOM, MP_EDEVICE } mp_errcode;

/* record a failure; always returns -1 so callers can `return mp_fail(...)` */
int mp_fail(mp_errcode code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *mp_error(void);
mp_errcode mp_errcode_last(void);
void mp_clear_error(void);

#endif
