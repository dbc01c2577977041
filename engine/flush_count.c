/*
 * flush_count.c: per op name flush counts of the backward pass (flush_count.h).
 *
 * The host's table has one entry per op name met, and grows. The devices' slots
 * are lent to names: slot k of every device counts for entry owner[k]. When
 * the names in use outnumber the slots, fold() adds every device's slots into
 * the entries they were lent to (the devices zero them as they are read) and
 * takes the slots back, so the next names start from slot 0 again.
 */
#include <stdlib.h>
#include <string.h>
#include "engine/flush_count.h"
#include "engine/error.h"

typedef struct {
    const char *name;              /* an op's name (static: the description's) */
    int64_t c[3];                  /* rounded, became zero, became inf: folded in so far */
    int slot;                      /* the device slot it counts into now; -1: none */
} entry;

static bool counting;
static entry *table;
static int nentries, cap;
static int owner[MP_FLUSH_SLOTS];  /* slot k's entry */
static int nslots;                 /* slots lent: 0 .. nslots-1 */
static unsigned counted;           /* bit d: device d counted since its slots were last read */

void mp_autograd_count_flush(bool on) { counting = on; }

/* every device's slots into the entries they were lent to; the slots are then free */
static void fold(void)
{
    int64_t c[MP_FLUSH_SLOTS][3];
    for (int d = 0; d < MP_NDEVICES; d++) {
        if (!(counted >> d & 1u)) continue;
        const mp_backend *be = mp_backend_of((mp_device)d);
        be->flush_read(be->ctx, c, 1);
        for (int k = 0; k < nslots; k++)
            for (int j = 0; j < 3; j++) table[owner[k]].c[j] += c[k][j];
    }
    counted = 0;
    for (int k = 0; k < nslots; k++) table[owner[k]].slot = -1;
    nslots = 0;
}

void mp_autograd_flush_reset(void)
{
    for (int d = 0; d < MP_NDEVICES; d++) {
        if (!(counted >> d & 1u)) continue;
        const mp_backend *be = mp_backend_of((mp_device)d);
        be->flush_read(be->ctx, NULL, 1);
    }
    counted = 0;
    nslots = 0;
    nentries = 0;
}

const char *mp_autograd_flush_entry(int i, int64_t counts[3])
{
    if (i == 0 && counted) {
        fold();
    }
    if (i < 0 || i >= nentries) return NULL;
    memcpy(counts, table[i].c, sizeof table[i].c);
    return table[i].name;
}

/* the entry of an op's name, made when new; -1 out of memory */
static int entry_of(const char *name)
{
    for (int i = 0; i < nentries; i++)
        if (table[i].name == name || strcmp(table[i].name, name) == 0) return i;
    if (nentries == cap) {
        int c = cap ? 2 * cap : 64;
        entry *t = realloc(table, sizeof *t * (size_t)c);
        if (!t) return mp_fail(MP_EOOM, "out of memory counting the flushes of %s", name);
        table = t, cap = c;
    }
    table[nentries] = (entry){.name = name, .slot = -1};
    return nentries++;
}

int mp_flush_count_begin(mp_device dev, const char *name, bool *on)
{
    const mp_backend *be = mp_backend_of(dev);
    *on = false;
    if (!counting || !be->flush_slot) return 0;
    int i = entry_of(name);
    if (i < 0) return -1;
    if (table[i].slot < 0) {
        if (nslots == MP_FLUSH_SLOTS) fold();
        owner[nslots] = i;
        table[i].slot = nslots++;
    }
    counted |= 1u << dev;
    be->flush_slot(be->ctx, table[i].slot);
    *on = true;
    return 0;
}

void mp_flush_count_end(mp_device dev)
{
    const mp_backend *be = mp_backend_of(dev);
    be->flush_slot(be->ctx, -1);
}
