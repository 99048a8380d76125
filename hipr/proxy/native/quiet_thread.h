/* A detached helper thread of the proxy's own (the keeper of client.c, the data links'
 * senders, the ssh spawner of transport.c) that takes no signals: those are meant for the
 * program's threads, and one delivered here would run the program's handler on a thread
 * it does not know. */
#ifndef HIPR_QUIET_THREAD_H
#define HIPR_QUIET_THREAD_H

#include <pthread.h>
#include <signal.h>

/* Starts fn(arg) on such a thread: 0, or pthread_create's error. */
static inline int hipr_start_quiet_thread_arg(void *(*fn)(void *), void *arg) {
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* The new thread inherits the mask in force at its creation. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&th, &attr, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return rc;
}

/* Starts fn(NULL) on such a thread: 0, or pthread_create's error. */
static inline int hipr_start_quiet_thread(void *(*fn)(void *)) {
    return hipr_start_quiet_thread_arg(fn, NULL);
}

#endif
