// bootstrap_tcp: a one-shot broadcast from rank 0 over TCP with a deadline.
#include "dist/bootstrap_tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/timer.h"

// Every message starts with this word, so a stray connection to the port is told apart.
#define TCP_MAGIC 0x46475054u  // "FGPT"
#define RETRY_NS 100000000L    // 0.1 s between connection attempts while rank 0 starts

static int ms_left(double deadline) {
    const double s = deadline - now_seconds();
    return s <= 0 ? 0 : (int)(s * 1e3) + 1;
}

// Moves len bytes over fd in direction `out` (send) or in (recv) before the deadline.
static int transfer(int fd, void *buf, size_t len, int out, double deadline) {
    char *p = buf;
    while (len > 0) {
        struct pollfd pfd = {.fd = fd, .events = out ? POLLOUT : POLLIN};
        if (poll(&pfd, 1, ms_left(deadline)) <= 0) return -1;
        const ssize_t k = out ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (k <= 0) {
            if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            return -1;
        }
        p += k, len -= (size_t)k;
    }
    return 0;
}

// Rank 0: accepts world - 1 ranks and sends each the bytes.
static int serve(int port, int world, const void *buf, size_t len, double timeout_s, char *err,
                 size_t errlen) {
    const double deadline = now_seconds() + timeout_s;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return set_error(err, errlen, "bootstrap: socket: %s", strerror(errno));
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, world) != 0) {
        const int e = errno;
        close(fd);
        return set_error(err, errlen,
                         "bootstrap: rank 0 cannot listen on port %d (MASTER_PORT + 1): "
                         "%s; choose another MASTER_PORT",
                         port, strerror(e));
    }
    char *arrived = xcalloc((size_t)world, 1);  // (world)
    arrived[0] = 1;
    int n_arrived = 1;
    while (n_arrived < world) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, ms_left(deadline)) <= 0) break;
        const int cfd = accept(fd, NULL, NULL);
        if (cfd < 0) continue;
        uint32_t hello[2];  // magic, rank
        const uint32_t head = TCP_MAGIC;
        if (transfer(cfd, hello, sizeof hello, 0, deadline) == 0 && hello[0] == TCP_MAGIC &&
            hello[1] > 0 && hello[1] < (uint32_t)world && !arrived[hello[1]] &&
            transfer(cfd, (void *)&head, sizeof head, 1, deadline) == 0 &&
            transfer(cfd, (void *)buf, len, 1, deadline) == 0) {
            arrived[hello[1]] = 1;
            n_arrived++;
        }
        close(cfd);
    }
    close(fd);
    int rc = 0;
    if (n_arrived < world) {
        char missing[512] = "";
        size_t used = 0;
        for (int r = 1; r < world && used + 16 < sizeof missing; r++)
            if (!arrived[r])
                used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                         used ? ", " : "", r);
        rc = set_error(err, errlen,
                       "bootstrap: rank 0: rank(s) %s of %d did not connect to port %d "
                       "within %.0f s: check that they started, that MASTER_ADDR names "
                       "this host and that the port is reachable",
                       missing, world, port, timeout_s);
    }
    free(arrived);
    return rc;
}

// One non-blocking connection attempt to ai before the deadline; the socket, or -1.
static int try_connect(const struct addrinfo *ai, double deadline) {
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) return -1;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (errno != EINPROGRESS || poll(&pfd, 1, ms_left(deadline)) <= 0 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0) {
            close(fd);
            return -1;
        }
    }
    return fd;
}

// Ranks > 0: connects to rank 0 (retrying while it starts), says who it is, reads the bytes.
static int fetch(const char *addr, int port, int rank, void *buf, size_t len, double timeout_s,
                 char *err, size_t errlen) {
    const double deadline = now_seconds() + timeout_s;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    const int gai = getaddrinfo(addr, service, &hints, &ai);
    if (gai != 0)
        return set_error(err, errlen, "bootstrap: rank %d: MASTER_ADDR '%s' does not resolve: %s",
                         rank, addr, gai_strerror(gai));
    int fd = -1;
    while (fd < 0 && now_seconds() < deadline) {
        for (const struct addrinfo *a = ai; a && fd < 0; a = a->ai_next)
            fd = try_connect(a, deadline);
        if (fd < 0) nanosleep(&(struct timespec){0, RETRY_NS}, NULL);
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return set_error(err, errlen,
                         "bootstrap: rank %d: rank 0 did not answer at %s:%d within %.0f s: "
                         "check that rank 0 started and that MASTER_ADDR / MASTER_PORT "
                         "are the same on every rank",
                         rank, addr, port, timeout_s);
    const uint32_t hello[2] = {TCP_MAGIC, (uint32_t)rank};
    uint32_t head = 0;
    int rc = 0;
    if (transfer(fd, (void *)hello, sizeof hello, 1, deadline) != 0 ||
        transfer(fd, &head, sizeof head, 0, deadline) != 0 || head != TCP_MAGIC ||
        transfer(fd, buf, len, 0, deadline) != 0)
        rc = set_error(err, errlen,
                       "bootstrap: rank %d: rank 0 at %s:%d refused this rank or closed the "
                       "connection (another rank %d running, or not a flashgpt rank 0)",
                       rank, addr, port, rank);
    close(fd);
    return rc;
}

int tcp_broadcast(const char *addr, int port, int rank, int world, void *buf, size_t len,
                  double timeout_s, char *err, size_t errlen) {
    if (world == 1) return 0;
    return rank == 0 ? serve(port, world, buf, len, timeout_s, err, errlen)
                     : fetch(addr, port, rank, buf, len, timeout_s, err, errlen);
}
