/*
 * A program whose working set the test knows, for `--limit auto` (tests/autolimit.rs).
 *
 *   workingset shrink MIB HOT_MIB SECONDS   fill MIB, then for SECONDS touch (check, then
 *                                           write) random pages of the first HOT_MIB only;
 *                                           at the end check every page
 *   workingset hot MIB SECONDS              fill MIB, then sweep all of it, every page checked
 *                                           and written, until SECONDS have passed
 *
 * Every page holds (page number, version) in each of its words; a page read with another
 * value is counted bad. Prints "PHASE: ... N bad pages" and exits 1 if any page was bad.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define PAGE 4096
#define WORDS (PAGE / 8)

static uint64_t *mem;
static uint32_t *version;
static long bad;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static uint64_t word(size_t page, uint32_t v)
{
	return ((uint64_t)page << 32) | v;
}

static void touch(size_t page)
{
	uint64_t *p = mem + page * WORDS;
	uint64_t want = word(page, version[page]);
	if (p[0] != want || p[WORDS - 1] != want || p[WORDS / 2] != want)
		bad++;
	version[page]++;
	want = word(page, version[page]);
	for (size_t i = 0; i < WORDS; i++)
		p[i] = want;
}

static long check_all(size_t pages)
{
	long wrong = 0;
	for (size_t pg = 0; pg < pages; pg++) {
		uint64_t want = word(pg, version[pg]);
		for (size_t i = 0; i < WORDS; i++)
			if (mem[pg * WORDS + i] != want) {
				wrong++;
				break;
			}
	}
	return wrong;
}

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	int shrink = !strcmp(argv[1], "shrink");
	size_t pages = (size_t)atol(argv[2]) << 20 >> 12;
	size_t hot = shrink ? (size_t)atol(argv[3]) << 20 >> 12 : pages;
	double seconds = atof(argv[shrink ? 4 : 3]);
	mem = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	version = calloc(pages, sizeof *version);
	if (mem == MAP_FAILED || !version || hot == 0 || hot > pages)
		return 2;
	for (size_t pg = 0; pg < pages; pg++)
		for (size_t i = 0; i < WORDS; i++)
			mem[pg * WORDS + i] = word(pg, 0);
	uint64_t rng = 0x9E3779B97F4A7C15ull, touches = 0, sweeps = 0;
	double start = now();
	while (now() - start < seconds) {
		if (shrink) {
			for (int k = 0; k < 1000; k++) {
				rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
				touch(rng % hot);
				touches++;
			}
		} else {
			for (size_t pg = 0; pg < pages; pg++)
				touch(pg);
			sweeps++;
		}
	}
	double took = now() - start;
	long wrong = check_all(pages);
	printf("%s: %zu MiB, %zu MiB hot, %.1f s, %llu touches, %llu sweeps, %ld bad pages\n", argv[1],
	       pages >> 8, hot >> 8, took, (unsigned long long)touches, (unsigned long long)sweeps, bad + wrong);
	return bad + wrong != 0;
}
