/*
 * Open MPI over UCX on the emulated HCA: every byte checked.
 *
 * - ping-pong between rank 0 and every other rank, 8 B .. 256 KiB (powers of two), each
 *   message a pattern of (size, round, direction), checked byte by byte on arrival;
 * - MPI_Allreduce (sum and max) over 1 .. 4096 integers, checked against the closed form;
 * - one-sided: every rank MPI_Puts a pattern into its right neighbour's window and MPI_Gets
 *   its left neighbour's, between fences; both checked.
 *
 * Prints "ok ranks N" on rank 0 when everything matched; any mismatch aborts the job.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX (256 * 1024)

static int rank, size;

static void fail(const char *what, long a, long b, long c)
{
	fprintf(stderr, "rank %d: %s (%ld %ld %ld)\n", rank, what, a, b, c);
	MPI_Abort(MPI_COMM_WORLD, 2);
}

static unsigned char pattern(long n, long round, long dir, long i)
{
	return (unsigned char)(i * 131 + n * 7 + round * 3 + dir + (i >> 8));
}

static void fill(unsigned char *p, long n, long round, long dir)
{
	for (long i = 0; i < n; i++)
		p[i] = pattern(n, round, dir, i);
}

static void check(const unsigned char *p, long n, long round, long dir)
{
	for (long i = 0; i < n; i++)
		if (p[i] != pattern(n, round, dir, i))
			fail("ping-pong byte differs (size, round, byte)", n,
			     round, i);
}

int main(int argc, char **argv)
{
	unsigned char *buf;
	int *win_mem, *got;
	MPI_Win win;
	const int wn = 1024;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	buf = malloc(MAX);
	if (!buf)
		fail("malloc", 0, 0, 0);

	for (int peer = 1; peer < size; peer++) {
		for (long n = 8; n <= MAX; n *= 2) {
			for (long round = 0; round < 2; round++) {
				MPI_Status st;
				int count;

				if (rank == 0) {
					fill(buf, n, round, peer);
					MPI_Send(buf, (int)n, MPI_BYTE, peer, 7,
						 MPI_COMM_WORLD);
					memset(buf, 0, n);
					MPI_Recv(buf, (int)n, MPI_BYTE, peer, 8,
						 MPI_COMM_WORLD, &st);
					MPI_Get_count(&st, MPI_BYTE, &count);
					if (count != n)
						fail("pong length", n, count, peer);
					check(buf, n, round, 1000 + peer);
				} else if (rank == peer) {
					memset(buf, 0, n);
					MPI_Recv(buf, (int)n, MPI_BYTE, 0, 7,
						 MPI_COMM_WORLD, &st);
					MPI_Get_count(&st, MPI_BYTE, &count);
					if (count != n)
						fail("ping length", n, count, 0);
					check(buf, n, round, peer);
					fill(buf, n, round, 1000 + peer);
					MPI_Send(buf, (int)n, MPI_BYTE, 0, 8,
						 MPI_COMM_WORLD);
				}
			}
		}
	}

	for (int n = 1; n <= 4096; n *= 4) {
		int *in = malloc(n * sizeof(int)), *sum = malloc(n * sizeof(int)),
		    *max = malloc(n * sizeof(int));

		for (int i = 0; i < n; i++)
			in[i] = (rank + 1) * (i + 1);
		MPI_Allreduce(in, sum, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		MPI_Allreduce(in, max, n, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
		for (int i = 0; i < n; i++) {
			if (sum[i] != (i + 1) * size * (size + 1) / 2)
				fail("allreduce sum (count, index, value)", n, i,
				     sum[i]);
			if (max[i] != (i + 1) * size)
				fail("allreduce max (count, index, value)", n, i,
				     max[i]);
		}
		free(in);
		free(sum);
		free(max);
	}

	MPI_Alloc_mem(wn * sizeof(int), MPI_INFO_NULL, &win_mem);
	got = malloc(wn * sizeof(int));
	for (int i = 0; i < wn; i++)
		win_mem[i] = -1;
	MPI_Win_create(win_mem, wn * sizeof(int), sizeof(int), MPI_INFO_NULL,
		       MPI_COMM_WORLD, &win);
	{
		int right = (rank + 1) % size, left = (rank + size - 1) % size;
		int *src = malloc(wn * sizeof(int));

		for (int i = 0; i < wn; i++)
			src[i] = rank * 100000 + i;
		MPI_Win_fence(0, win);
		MPI_Put(src, wn, MPI_INT, right, 0, wn, MPI_INT, win);
		MPI_Win_fence(0, win);
		for (int i = 0; i < wn; i++)
			if (win_mem[i] != left * 100000 + i)
				fail("put (from, index, value)", left, i,
				     win_mem[i]);
		MPI_Get(got, wn, MPI_INT, left, 0, wn, MPI_INT, win);
		MPI_Win_fence(0, win);
		/* Left's window holds what left's left put there. */
		for (int i = 0; i < wn; i++)
			if (got[i] != ((left + size - 1) % size) * 100000 + i)
				fail("get (from, index, value)", left, i, got[i]);
		free(src);
	}
	MPI_Win_free(&win);
	MPI_Free_mem(win_mem);
	free(got);
	free(buf);
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("ok ranks %d\n", size);
	MPI_Finalize();
	return 0;
}
