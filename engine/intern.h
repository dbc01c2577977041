/*
 * intern.h: names that live as long as the process.
 *
 * A node's name is read after the node is gone: the backward's flush counts
 * (engine/flush_count.c) and mp.amp.diagnose's record (engine/observe.c) keep
 * the pointer, as they may, since an op's name is its description's static
 * string. Names made at run time (a Lua Function's, "<op>_backward" for a
 * gradient without a second derivative) are interned here, so they keep that
 * promise: one copy per distinct name, never freed (there are as many as a
 * program defines Functions and ops, not as many as it records nodes).
 */
#ifndef MP_INTERN_H
#define MP_INTERN_H

/* the process's copy of s (the same pointer for equal strings); NULL with an
 * out-of-memory error */
const char *mp_intern(const char *s);

#endif
