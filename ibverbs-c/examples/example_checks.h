/*
 * What the checking example programs (dc.c, mkey.c, timestamp.c) share: CHECK, which
 * prints "ok: WHAT" or "FAIL: WHAT (errno N)" and counts the failures;
 * die(), which ends the program on a setup step that failed; and
 * poll_one(), which waits for one completion. Define EXAMPLE (the
 * program's name, a string) before including it.
 */
#ifndef EXAMPLE_CHECKS_H
#define EXAMPLE_CHECKS_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

static int failed;

#define CHECK(cond, what)                                                     \
	do {                                                                  \
		if (cond)                                                     \
			printf("ok: %s\n", what);                             \
		else {                                                        \
			printf("FAIL: %s (errno %d)\n", what, errno);         \
			failed++;                                             \
		}                                                             \
	} while (0)

static inline void die(const char *what)
{
	fprintf(stderr, "%s: %s: %s\n", EXAMPLE, what, strerror(errno));
	exit(1);
}

/* Polls until one completion (spinning; the device is in this process or
 * a server of it); returns it. */
static inline struct ibv_wc poll_one(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	long spins = 0;
	int n;

	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		if (++spins > 2000000000L)
			die("no completion");
	if (n < 0)
		die("ibv_poll_cq");
	return wc;
}

#endif /* EXAMPLE_CHECKS_H */
