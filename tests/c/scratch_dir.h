/*
 * scratch_dir.h: a fresh directory under /tmp for each test of a suite that
 * writes files (TestSuite(name, .init = make_dir, .fini = remove_dir)); its
 * path is in `dir`. SCRATCH_PREFIX names it after the suite's file.
 */
#ifndef MP_TEST_SCRATCH_DIR_H
#define MP_TEST_SCRATCH_DIR_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <criterion/criterion.h>

static char dir[64];

static void make_dir(void)
{
    strcpy(dir, "/tmp/" SCRATCH_PREFIX "_XXXXXX");
    cr_assert(mkdtemp(dir), "mkdtemp");
}

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

#endif
