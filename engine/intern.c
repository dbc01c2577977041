/*
 * intern.c: names that live as long as the process (intern.h).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "engine/intern.h"
#include "engine/error.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;   /* Functions may be defined on any thread */
static char **names;
static size_t nnames, cap;

const char *mp_intern(const char *s)
{
    const char *r = NULL;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nnames && !r; i++)
        if (strcmp(names[i], s) == 0) r = names[i];
    if (!r) {
        char *copy = strdup(s);
        if (copy && nnames == cap) {
            size_t c = cap ? 2 * cap : 32;
            char **t = realloc(names, sizeof *t * c);
            if (t) names = t, cap = c;
        }
        if (copy && nnames < cap) r = names[nnames++] = copy;
        else free(copy);
    }
    pthread_mutex_unlock(&lock);
    if (!r) mp_fail(MP_EOOM, "out of memory keeping the name %s", s);
    return r;
}
