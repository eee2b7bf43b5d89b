/* p5: a page pinned for I/O (an io_uring fixed buffer, FOLL_LONGTERM) in MAP_SHARED|MAP_ANONYMOUS
 * memory, evicted the daemon's way (pread, punch): where does a later READ_FIXED into the
 * buffer land? The process plays the daemon for itself (root: /proc/self/map_files). */
#include "common.h"
#include <liburing.h>

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	char *p = mmap(NULL, PS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	memset(p, 'A', PS);
	struct io_uring ring;
	if (io_uring_queue_init(4, &ring, 0))
		DIE("io_uring_queue_init");
	struct iovec iov = {p, PS};
	int e = io_uring_register_buffers(&ring, &iov, 1);
	say("io_uring_register_buffers on the shared page -> %s\n", e ? strerror(-e) : "ok (pinned)");
	char tmp[] = "/tmp/p5-XXXXXX";
	int f = mkstemp(tmp);
	char b[PS];
	memset(b, 'B', PS);
	if (write(f, b, PS) != PS)
		DIE("write");
	unlink(tmp);

	int fd = open_map_files(getpid(), p, NULL);
	char store[PS];
	if (fd < 0 || pread(fd, store, PS, 0) != PS)
		DIE("map_files");
	e = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, PS) ? -errno : 0;
	say("daemon: pread ('%c') and punch -> %s\n", store[0], e ? strerror(-e) : "ok");

	struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
	io_uring_prep_read_fixed(sqe, f, p, PS, 0, 0);
	io_uring_submit(&ring);
	struct io_uring_cqe *cqe;
	io_uring_wait_cqe(&ring, &cqe);
	say("READ_FIXED of a file of 'B's into the registered buffer -> %d\n", cqe->res);
	io_uring_cqe_seen(&ring, cqe);
	off_t d = lseek(fd, 0, SEEK_DATA);
	say("page cache after the read: %s\n", d == 0 ? "has the page" : "still a hole");
	long nb = 0;
	for (size_t i = 0; i < PS; i++)
		nb += ((volatile char *)p)[i] == 'B';
	result("an io_uring fixed buffer in shared anonymous memory, punched by the daemon: a later "
	       "READ_FIXED returns %s, but the program's mapping shows %ld of %lu bytes of it (first "
	       "byte %#x): the device wrote into the pinned page the punch took out of the page "
	       "cache: DATA LOSS (a restore from the store would serve the 'A's)",
	       "success", nb, PS, (unsigned char)p[0]);
	return 0;
}
