/* See transport.h. */
#define _GNU_SOURCE
#include "transport.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int connect_timeout(int fd, const struct sockaddr *addr, socklen_t len, double timeout_s) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return -1;
    int rc = connect(fd, addr, len);
    if (rc < 0 && errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int ms = (int)(timeout_s * 1000);
        do rc = poll(&p, 1, ms);
        while (rc < 0 && errno == EINTR);
        if (rc == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        if (rc < 0) return -1;
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0) return -1;
        if (soerr) {
            errno = soerr;
            return -1;
        }
        rc = 0;
    }
    if (rc < 0) return -1;
    return fcntl(fd, F_SETFL, flags);
}

static int connect_unix(const char *path, double timeout_s, char *err, size_t err_size) {
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof addr.sun_path) {
        snprintf(err, err_size, "unix socket path too long: %s", path);
        return -1;
    }
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect_timeout(fd, (struct sockaddr *)&addr, sizeof addr, timeout_s) < 0) {
        snprintf(err, err_size, "cannot connect to unix://%s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

static int connect_tcp(const char *hostport, double timeout_s, char *err, size_t err_size) {
    char host[256];
    const char *colon = strrchr(hostport, ':');
    if (!colon || colon == hostport || (size_t)(colon - hostport) >= sizeof host) {
        snprintf(err, err_size, "tcp URL needs HOST:PORT, got %s", hostport);
        return -1;
    }
    size_t hl = (size_t)(colon - hostport);
    memcpy(host, hostport, hl);
    host[hl] = '\0';
    /* [::1]:port */
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(host, colon + 1, &hints, &res);
    if (gai) {
        snprintf(err, err_size, "cannot resolve %s: %s", hostport, gai_strerror(gai));
        return -1;
    }
    int fd = -1;
    int saved = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        if (connect_timeout(fd, ai->ai_addr, ai->ai_addrlen, timeout_s) == 0) break;
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, err_size, "cannot connect to tcp://%s: %s", hostport,
                 strerror(saved ? saved : errno));
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int hipr_transport_connect(const char *url, double timeout_s, char *err, size_t err_size) {
    if (strncmp(url, "unix://", 7) == 0) return connect_unix(url + 7, timeout_s, err, err_size);
    if (strncmp(url, "tcp://", 6) == 0) return connect_tcp(url + 6, timeout_s, err, err_size);
    if (strncmp(url, "tls://", 6) == 0 || strncmp(url, "ssh://", 6) == 0) {
        snprintf(err, err_size,
                 "%.6s URLs are not served by the native proxy yet (tcp:// and unix:// are); "
                 "forward the worker's port and use tcp://",
                 url);
        return -1;
    }
    snprintf(err, err_size, "unsupported worker URL %s (tcp://HOST:PORT or unix:///PATH)", url);
    return -1;
}

int hipr_transport_send_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

long hipr_transport_recv(int fd, void *buf, size_t n) {
    for (;;) {
        ssize_t k = recv(fd, buf, n, 0);
        if (k < 0 && errno == EINTR) continue;
        return (long)k;
    }
}

int hipr_transport_wait_readable(int fd, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    for (;;) {
        int rc = poll(&p, 1, timeout_ms);
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) return -1;
        return rc > 0;
    }
}
