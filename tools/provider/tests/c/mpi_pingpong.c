/* MPI ping-pong that checks its data: rank 0 sends a pattern, rank 1 checks it and sends
 * back its complement, rank 0 checks that; sizes 8 B .. 64 KiB. Prints "ok" on rank 0. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
	int rank, iters = 20;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	unsigned char *b = malloc(1 << 16);
	for (int size = 8; size <= (1 << 16); size *= 8) {
		for (int it = 0; it < iters; it++) {
			unsigned char seed = (unsigned char)(size + it);
			if (rank == 0) {
				for (int i = 0; i < size; i++) b[i] = (unsigned char)(seed + i);
				MPI_Send(b, size, MPI_BYTE, 1, it, MPI_COMM_WORLD);
				MPI_Recv(b, size, MPI_BYTE, 1, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (int i = 0; i < size; i++)
					if (b[i] != (unsigned char)~(seed + i)) { fprintf(stderr, "bad echo at %d/%d\n", size, i); MPI_Abort(MPI_COMM_WORLD, 1); }
			} else {
				MPI_Recv(b, size, MPI_BYTE, 0, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (int i = 0; i < size; i++) {
					if (b[i] != (unsigned char)(seed + i)) { fprintf(stderr, "bad data at %d/%d\n", size, i); MPI_Abort(MPI_COMM_WORLD, 1); }
					b[i] = ~b[i];
				}
				MPI_Send(b, size, MPI_BYTE, 0, it, MPI_COMM_WORLD);
			}
		}
	}
	if (rank == 0) printf("ok\n");
	free(b);
	MPI_Finalize();
	return 0;
}
