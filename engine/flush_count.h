/*
 * flush_count.h: telemetry of the backward pass, counted per op name.
 *
 * When on, every backward records how many values it rounded to f16/bf16, how
 * many nonzero ones became zero and how many finite ones became inf, summed per
 * op name until reset. While a node's backward runs, its device's backend
 * counts into the device slot of the node's name (kernels/backend.h: flush_slot,
 * MP_FLUSH_SLOTS of them), in the backend's own memory, so a counted backward
 * waits for nothing; the counts come to the host when read. Names are any
 * number: when a backward meets a name and every device slot is taken, the
 * slots are first folded into the host's sums (one read per device that
 * counted: a wait on an asynchronous device) and handed out again.
 *
 * Process-wide, as the backends' slots are.
 */
#ifndef MP_FLUSH_COUNT_H
#define MP_FLUSH_COUNT_H

#include "engine/tensor.h"

void mp_autograd_count_flush(bool on);
/* forget the names and the counts (the devices' slots are zeroed without a read) */
void mp_autograd_flush_reset(void);
/* the i-th op's sums (i from 0; entry 0 reads the devices' slots); NULL past the end */
const char *mp_autograd_flush_entry(int i, int64_t counts[3]);

/* engine/backward.c's, around one node's backward on dev: *counting is set
 * when dev's backend now counts into the slot of name (flush counting is on
 * and the backend has counters), and then mp_flush_count_end follows the
 * node's backward. -1 with an error only when the host's table cannot grow. */
int mp_flush_count_begin(mp_device dev, const char *name, bool *counting);
void mp_flush_count_end(mp_device dev);

#endif
