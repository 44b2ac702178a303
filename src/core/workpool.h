/*
 * workpool: a few threads that do work the I/O thread must not do, and hand each finished job back to it.
 *
 * An event loop that parses an 8 MiB body, tokenizes it or builds a 60 MB answer stalls every connection it
 * serves (/health included) for as long as that takes. Such work runs here instead: workpool_submit queues a
 * job (any thread); a worker runs job->run, puts the job on the done list and calls notify (the server's
 * http_server_wake, so the loop wakes); the loop then calls workpool_complete, which runs job->done for every
 * finished job, on the loop's own thread, in the order they finished. Nothing else crosses the threads: a job
 * hands its results over in its own memory, and the done list's mutex orders the worker's writes before the
 * loop's reads.
 *
 * A job belongs to its submitter (embed struct workpool_job in the object the work is for); the pool only
 * links it, from workpool_submit until its done callback starts.
 */
#ifndef WAFER_CORE_WORKPOOL_H
#define WAFER_CORE_WORKPOOL_H

struct workpool_job {
    void (*run)(struct workpool_job *j);  /* on a worker thread */
    void (*done)(struct workpool_job *j); /* on the thread that calls workpool_complete; may free the job */
    struct workpool_job *next;            /* the pool's */
};

struct workpool; /* opaque */

/* Starts n_threads workers (1..64). notify(ctx) is called from a worker after each job finished (it must be
 * thread-safe; http_server_wake is). NULL with a message in err (ERR_MSG_MAX) on failure. Caller frees with
 * workpool_destroy. */
struct workpool *workpool_create(int n_threads, void (*notify)(void *ctx), void *ctx, char *err);

/* Queues j (run and done set by the caller); any thread. Jobs start in the order they were submitted. */
void workpool_submit(struct workpool *p, struct workpool_job *j);

/* Runs the done callback of every job finished so far, oldest first; returns how many ran. Call it from one
 * thread only (the I/O thread). */
int workpool_complete(struct workpool *p);

/* Jobs queued or running (for metrics and tests); any thread. */
int workpool_pending(struct workpool *p);

/* Lets the workers finish every queued job, joins them, runs the done callbacks of all finished jobs on the
 * calling thread, then frees the pool. NULL is a no-op. */
void workpool_destroy(struct workpool *p);

#endif
