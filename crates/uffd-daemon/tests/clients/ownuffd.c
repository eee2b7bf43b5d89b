/*
 * A program with a userfaultfd of its own (as post-copy migration, garbage collectors and
 * checkpointing tools have): it fills MIB MiB, pages more memory so that the daemon evicts
 * them, then registers them with its own uffd (missing faults), checks every word, drops a few
 * pages and serves their faults itself with a pattern of its own. Exits non-zero on any wrong
 * word or a registration refused.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static int uffd;
static char own[4096];

static void *handler(void *arg)
{
	(void)arg;
	for (;;) {
		struct pollfd p = { .fd = uffd, .events = POLLIN };
		if (poll(&p, 1, -1) < 0)
			return NULL;
		struct uffd_msg m;
		if (read(uffd, &m, sizeof m) != sizeof m)
			continue;
		if (m.event != UFFD_EVENT_PAGEFAULT)
			continue;
		struct uffdio_copy c = { .dst = m.arg.pagefault.address & ~4095ULL, .src = (uint64_t)own, .len = 4096 };
		ioctl(uffd, UFFDIO_COPY, &c);
	}
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 32;
	size_t bytes = mib << 20;
	uint64_t *r = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r == MAP_FAILED)
		return 2;
	for (size_t i = 0; i < bytes / 8; i++)
		r[i] = i ^ 0x5555;
	/* Other memory, so that the first region goes cold and is evicted. */
	uint64_t *other = malloc(2 * bytes);
	for (size_t i = 0; i < 2 * bytes / 8; i++)
		other[i] = i;
	uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
	struct uffdio_api api = { .api = UFFD_API };
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) {
		perror("userfaultfd");
		return 2;
	}
	struct uffdio_register reg = { .range = { (uint64_t)r, bytes }, .mode = UFFDIO_REGISTER_MODE_MISSING };
	if (ioctl(uffd, UFFDIO_REGISTER, &reg)) {
		perror("UFFDIO_REGISTER of the program's own memory");
		return 1;
	}
	long bad = 0;
	for (size_t i = 0; i < bytes / 8; i++)
		bad += r[i] != (i ^ 0x5555);
	/* Pages the program drops now fault to its own handler. */
	memset(own, 0xab, sizeof own);
	pthread_t t;
	pthread_create(&t, NULL, handler, NULL);
	madvise((char *)r + 4096 * 10, 4096 * 4, MADV_DONTNEED);
	long served = 0;
	for (size_t i = 10 * 512; i < 14 * 512; i++)
		served += r[i] == 0xababababababababULL;
	printf("own uffd: %ld bad words, %ld of 2048 words served by its own handler\n", bad, served);
	return bad != 0 || served != 2048;
}
