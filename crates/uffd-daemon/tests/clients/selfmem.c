/*
 * A program that reads and writes its own memory through /proc/self/mem (tests/inspection.rs):
 * 32 MiB filled (mostly evicted under the test's limit), read back whole through the file, a
 * word written through it to a page never touched; after the close, the memory is checked
 * again (paged as before). Exits 1 on any difference.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
int main(void) {
	size_t len = 32 << 20;
	uint64_t *m = mmap(NULL, len, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
	for (size_t i = 0; i < len/8; i++) m[i] = i * 2654435761u;
	uint64_t *untouched = mmap(NULL, 1 << 20, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
	usleep(300000);
	int fd = open("/proc/self/mem", O_RDWR);
	if (fd < 0) { perror("open"); return 2; }
	uint64_t *buf = malloc(len);
	ssize_t n = pread(fd, buf, len, (off_t)(uintptr_t)m);
	long bad = 0;
	for (size_t i = 0; n == (ssize_t)len && i < len/8; i++) bad += buf[i] != i * 2654435761u;
	uint64_t v = 42;
	ssize_t w = pwrite(fd, &v, 8, (off_t)(uintptr_t)(untouched + 100));
	printf("read %zd of %zu bytes, %ld bad words; write to an untouched page: %zd, reads back %llu\n", n, len, bad, w, (unsigned long long)untouched[100]);
	close(fd);
	usleep(1500000); /* past the daemon's grace after the ask (1 s), so that the hold ends */
	for (size_t r = 0; r < 2; r++) for (size_t i = 0; i < len/8; i++) if (m[i] != i * 2654435761u) bad++;
	printf("after close: %ld bad\n", bad);
	return bad != 0 || n != (ssize_t)len || w != 8;
}
