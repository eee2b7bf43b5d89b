/*
 * fork_race MIB THREADS FORKS: fill MIB MiB with known words (never written again), then THREADS
 * threads read random pages of it (bringing evicted pages back) while the main thread forks
 * FORKS children one after another; each child checks every word (saying how many were wrong,
 * how many were zeros, and on how many pages) and exits non-zero if one was wrong. Prints
 * "fork_race: FORKS children, B bad children, W bad words (parent P)".
 *
 * Under the daemon, a fault read in the same batch as the FORK event and served before it was
 * applied filled the parent after the fork had copied its page tables: the child read zeros on
 * those pages (1-4 pages in 4 to 17 of every 10 to 30 children before the fix).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t *m;
static size_t words;
static atomic_int stop;

static uint64_t word(size_t i) { return (i * 0x9e3779b97f4a7c15ull) | 1; }

static void *reader(void *arg)
{
	uint64_t x = (uintptr_t)arg * 7919 + 1;
	uint64_t sum = 0;
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		size_t i = (x % (words / 512)) * 512;
		sum += m[i];
	}
	return (void *)(uintptr_t)sum;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: fork_race MIB THREADS FORKS\n");
		return 2;
	}
	size_t bytes = (size_t)atol(argv[1]) << 20;
	int threads = atoi(argv[2]), forks = atoi(argv[3]);
	words = bytes / 8;
	m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return 2;
	for (size_t i = 0; i < words; i++)
		m[i] = word(i);
	pthread_t t[64];
	if (threads > 64)
		threads = 64;
	for (int i = 0; i < threads; i++)
		pthread_create(&t[i], NULL, reader, (void *)(uintptr_t)(i + 1));
	int bad_children = 0;
	long bad_words = 0;
	for (int f = 0; f < forks; f++) {
		pid_t c = fork();
		if (c == 0) {
			long bad = 0, zeros = 0, pages = 0;
			for (size_t i = 0; i < words; i++) {
				bad += m[i] != word(i);
				zeros += m[i] == 0;
				if (i % 512 == 511 && m[i] != word(i))
					pages++;
			}
			if (bad)
				fprintf(stderr, "child %d: %ld bad words, %ld zero, %ld pages\n", f, bad, zeros, pages);
			_exit(bad ? (bad > 250 ? 250 : (int)bad) : 0);
		}
		int st;
		waitpid(c, &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			bad_children++;
			bad_words += WIFEXITED(st) ? WEXITSTATUS(st) : 1000;
		}
	}
	atomic_store(&stop, 1);
	for (int i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	long bad = 0;
	for (size_t i = 0; i < words; i++)
		bad += m[i] != word(i);
	printf("fork_race: %d children, %d bad children, %ld bad words (parent %ld)\n", forks,
	       bad_children, bad_words, bad);
	return bad_children || bad;
}
