/*
 * data_file.h: reading a text file for mp.data.text: a regular file only,
 * refused by its kind or size before anything is read, into a u8 tensor.
 */
#ifndef MP_DATA_FILE_H
#define MP_DATA_FILE_H

#include "engine/tensor.h"

/* The bytes of the regular file at path as a 1-d u8 CPU tensor in *out (NULL
 * for an empty file: tensors have no zero sizes). Never blocks in open and never
 * reads more than max_bytes: a directory, FIFO, device or socket fails naming
 * what it is ("path 'p' is a directory, not a regular file"), as does a file of
 * more than max_bytes bytes, by fstat or by what reading it gives. Returns 0, or
 * -1 with the message. */
int mp_read_file_bytes(const char *path, int64_t max_bytes, mp_tensor **out);

#endif
