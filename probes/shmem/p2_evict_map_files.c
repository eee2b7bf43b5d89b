/* p2: eviction from outside. A root daemon D opens /proc/P/map_files/START-END of P's shared
 * mapping (an fd to the shmem inode), preads a page, punches it (fallocate PUNCH_HOLE|KEEP_SIZE)
 * and serves the next touch, in whichever mapper, from its copy. What pagemap, mincore,
 * SEEK_HOLE, RssShmem and Shmem say about the punched page; which uffd events the punch raises;
 * restoring by pwrite into the fd + UFFDIO_WAKE instead of UFFDIO_COPY; MADV_REMOVE and
 * MADV_DONTNEED from inside (the same UFFD_EVENT_REMOVE) and how D can tell them apart. */
#include "common.h"

static const uint64_t FEAT = UFFD_FEATURE_MISSING_SHMEM | UFFD_FEATURE_THREAD_ID |
			     UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP;

static void show_page(const char *when, int page)
{
	struct reply rp = call(&g_w[0], OP_MINCORE, page, 0, 0);
	struct reply rc = call(&g_w[1], OP_MINCORE, page, 0, 0);
	say("  %s: page %d: P pagemap %s mincore %lu | C pagemap %s mincore %lu | RssShmem P %ld "
	    "kB C %ld kB | Shmem %ld kB\n",
	    when, page, pm_str(pagemap_entry(g_w[0].pid, g_region + page * PS)),
	    (unsigned long)rp.val, pm_str(pagemap_entry(g_w[1].pid, g_region + page * PS)),
	    (unsigned long)rc.val, rss_shmem_kb(g_w[0].pid), rss_shmem_kb(g_w[1].pid),
	    meminfo_kb("Shmem"));
}

static void run(enum backing b)
{
	say("\n== %s: eviction by a root daemon through /proc/P/map_files ==\n", backing_name[b]);
	const int N = 64;
	start_workers(b, N, 1);
	struct worker *P = &g_w[0], *C = &g_w[1];
	give_uffd(P, FEAT, UFFDIO_REGISTER_MODE_MISSING, NULL);
	give_uffd(C, FEAT, UFFDIO_REGISTER_MODE_MISSING, NULL);
	g_log_faults = 0;
	for (int i = 0; i < N; i++) {
		call(P, OP_FILL, i, 0xA0 + (i & 15), 0);
		call(C, OP_READ, i, 0, 0);
	}
	g_log_faults = 1;

	char lp[512], lc[512];
	maps_line(P->pid, g_region, lp, sizeof lp);
	maps_line(C->pid, g_region, lc, sizeof lc);
	say("P maps: %s\nC maps: %s\n", lp, lc);
	unsigned long start;
	int fd = open_map_files(P->pid, g_region, &start);
	int fdc = open_map_files(C->pid, g_region, NULL);
	if (fd < 0) {
		result("%s: open(/proc/P/map_files/..., O_RDWR) -> %s", backing_name[b],
		       strerror(-fd));
		stop_workers();
		return;
	}
	struct stat sp, sc;
	fstat(fd, &sp);
	fstat(fdc, &sc);
	result("%s: root opens /proc/PID/map_files/START-END O_RDWR: ok; inode via P %lu:%lu, via C "
	       "%lu:%lu (%s), size %ld pages: page identity is (inode, offset)",
	       backing_name[b], (unsigned long)sp.st_dev, (unsigned long)sp.st_ino,
	       (unsigned long)sc.st_dev, (unsigned long)sc.st_ino,
	       sp.st_ino == sc.st_ino && sp.st_dev == sc.st_dev ? "the same" : "DIFFERENT",
	       (long)(sp.st_size / PS));

	/* evict 16 pages: 8..23 */
	long shmem0 = meminfo_kb("Shmem"), rp0 = rss_shmem_kb(P->pid), rc0 = rss_shmem_kb(C->pid);
	show_page("before", 8);
	long bad = 0;
	for (int i = 8; i < 24; i++) {
		if (pread(fd, g_store + i * PS, PS, i * PS) != PS)
			DIE("pread");
		for (size_t k = 0; k < PS; k++)
			bad += g_store[i * PS + k] != (unsigned char)(0xA0 + (i & 15));
		g_stored[i] = 1;
	}
	int e = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 8 * PS, 16 * PS) ? -errno
											    : 0;
	serve_for(50);
	say("(no uffd event is printed above: the punch raised none in P or C)\n");
	result("%s: pread of 16 pages through the fd: %ld wrong bytes; fallocate(PUNCH_HOLE|"
	       "KEEP_SIZE) -> %s",
	       backing_name[b], bad, e ? strerror(-e) : "ok");
	show_page("after punch", 8);
	off_t h = lseek(fd, 0, SEEK_HOLE), d = lseek(fd, h, SEEK_DATA);
	result("%s: after the punch: Shmem -%ld kB, RssShmem P -%ld kB, C -%ld kB (each mapper counts "
	       "the page; the system once); lseek SEEK_HOLE on the fd -> page %ld, SEEK_DATA after "
	       "it -> page %ld",
	       backing_name[b], shmem0 - meminfo_kb("Shmem"), rp0 - rss_shmem_kb(P->pid),
	       rc0 - rss_shmem_kb(C->pid), (long)(h / PS), (long)(d / PS));

	long m0 = g_nfault_missing;
	struct reply r = call(C, OP_CHECKFILL, 8, 0xA8, 0);
	long m1 = g_nfault_missing;
	struct reply r2 = call(P, OP_CHECKFILL, 8, 0xA8, 0);
	long m2 = g_nfault_missing;
	result("%s: C touches punched page 8: %ld MISSING fault(s) (on C's uffd, above), %ld wrong "
	       "bytes; P then: %ld faults, %ld wrong bytes",
	       backing_name[b], m1 - m0, (long)r.r, m2 - m1, (long)r2.r);
	m0 = g_nfault_missing;
	r = call(P, OP_CHECKFILL, 9, 0xA9, 0);
	result("%s: P touches punched page 9: %ld MISSING fault(s) on P's uffd, %ld wrong bytes",
	       backing_name[b], g_nfault_missing - m0, (long)r.r);
	show_page("after restore", 8);

	/* restore by pwrite into the shmem fd + UFFDIO_WAKE */
	g_restore_fd = fd;
	m0 = g_nfault_missing;
	r = call(C, OP_CHECKFILL, 10, 0xAA, 0);
	r2 = call(P, OP_CHECKFILL, 10, 0xAA, 0);
	result("%s: restore by pwrite(fd) + UFFDIO_WAKE instead of UFFDIO_COPY: %ld fault(s), C sees "
	       "%ld wrong bytes, P %ld",
	       backing_name[b], g_nfault_missing - m0, (long)r.r, (long)r2.r);
	g_restore_fd = -1;

	/* a mapper outside the daemon's knowledge: D maps the fd itself, unregistered */
	char *dm = mmap(NULL, N * PS, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	m0 = g_nfault_missing;
	unsigned char v = dm[11 * PS];
	r = call(P, OP_CHECKFILL, 11, 0xAB, 0);
	result("%s: an unregistered mapper (D maps the fd) reads punched page 11: sees %#x, "
	       "%ld faults anywhere; P then has %ld wrong bytes in page 11 (DATA LOSS: the hole was "
	       "filled with zeros)",
	       backing_name[b], v, g_nfault_missing - m0, (long)r.r);
	/* read()/write() through the fd on a punched page */
	unsigned char buf[PS];
	ssize_t n = pread(fd, buf, PS, 12 * PS);
	long nz = 0;
	for (int k = 0; k < PS; k++)
		nz += buf[k] != 0;
	m0 = g_nfault_missing;
	r = call(P, OP_CHECKFILL, 12, 0xAC, 0);
	result("%s: pread(fd) of punched page 12 -> %zd bytes, %ld non-zero (zeros, no fault); "
	       "the page is still a hole: P then faults %ld time(s), %ld wrong bytes",
	       backing_name[b], n, nz, g_nfault_missing - m0, (long)r.r);
	uint64_t word = 0x1234;
	n = pwrite(fd, &word, 8, 13 * PS);
	m0 = g_nfault_missing;
	r = call(P, OP_CHECKFILL, 13, 0xAD, 0);
	result("%s: pwrite(fd) of 8 bytes into punched page 13 -> %zd, P then faults %ld time(s) and "
	       "sees %ld wrong bytes (DATA LOSS: the write made a new zero page)",
	       backing_name[b], n, g_nfault_missing - m0, (long)r.r);
	munmap(dm, N * PS);

	/* MADV_REMOVE and MADV_DONTNEED from inside: the same event; what D can see first */
	g_peek_syscall = 1;
	say("P: madvise(page 30, MADV_DONTNEED) then madvise(page 31, MADV_REMOVE) "
	    "(MADV_DONTNEED=%d MADV_REMOVE=%d, madvise is syscall %d)\n",
	    MADV_DONTNEED, MADV_REMOVE, SYS_madvise);
	call(P, OP_MADVISE, 30, MADV_DONTNEED, 1);
	call(P, OP_MADVISE, 31, MADV_REMOVE, 1);
	g_peek_syscall = 0;
	h = lseek(fd, 30 * PS, SEEK_HOLE);
	result("%s: both raise UFFD_EVENT_REMOVE on P's uffd only; while it is unread the caller "
	       "waits in madvise and /proc/P/task/TID/syscall shows the advice (lines above); first "
	       "hole at or after page 30: page %ld (DONTNEED kept page 30's data, REMOVE punched 31)",
	       backing_name[b], (long)(h / PS));
	close(fd);
	close(fdc);
	stop_workers();
	reap_all();
}

int main(int argc, char **argv)
{
	probe_init(argc, argv);
	for (int b = 0; b < NBACKING; b++)
		run(b);
	return 0;
}
