/*
 * allreduce.c: Open MPI's own MPI_Allreduce (in place, f32 sum) on given
 * sizes, the reference for mp.dist's gradient average in make bench
 * (scripts/bench/bench_dist.lua). Run under mpirun; rank 0 prints, per size:
 *   mpi_allreduce BYTES  TIME_US  ALGBW_GBPS  BUSBW_GBPS
 * (nccl-tests' measures: algbw = bytes / time, busbw = algbw * 2(n-1)/n).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int a = 1; a < argc; a++) {
        long n = atol(argv[a]);
        if (n < 1) continue;
        float *buf = malloc(sizeof *buf * (size_t)n);
        if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
        for (long i = 0; i < n; i++) buf[i] = 1.0f;
        int iters = n > (1 << 22) ? 10 : n > (1 << 18) ? 50 : 200;
        for (int w = 0; w < 3; w++) MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int it = 0; it < iters; it++) MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / iters;
        double bytes = (double)n * 4, alg = bytes / t / 1e9;
        if (rank == 0)
            printf("mpi_allreduce %.0f %.1f %.3f %.3f\n", bytes, t * 1e6, alg, alg * 2.0 * (size - 1) / size);
        free(buf);
    }
    MPI_Finalize();
    return 0;
}
