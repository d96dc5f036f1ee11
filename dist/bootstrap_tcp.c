// bootstrap_tcp: a one-shot broadcast from rank 0 over TCP with a deadline, behind a
// challenge-response hello that proves the job token (bootstrap_tcp.h).
#define _GNU_SOURCE  // accept4: an accepted socket is non-blocking from its first byte
#include "dist/bootstrap_tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/timer.h"

// Every message starts with this word, so a stray connection to the port is told apart. It
// changed when the hello gained its proof, so that a rank 0 and a rank from builds before and
// after it never take each other's bytes for a hello or an id.
#define TCP_MAGIC 0x46475032u  // "FGP2"
#define RETRY_NS 100000000L    // 0.1 s between connection attempts while rank 0 starts

enum {
    NONCE_BYTES = 32,
    MAC_BYTES = 32,                     // HMAC-SHA256
    CHALLENGE_BYTES = 4 + NONCE_BYTES,  // magic, nonce
    HELLO_BYTES = 8 + MAC_BYTES,        // magic, rank, proof
    MAX_PENDING = 64,                   // connections served at once; more wait in the backlog
    PEER_NAME = 64,                     // "address:port" of a connection, for the log
};

// ---- bytes, time and the proof ----

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

// Milliseconds until the deadline for poll(), capped: dist.timeout may be up to 1e9 s, whose
// milliseconds do not fit an int.
static int ms_left(double deadline) {
    const double s = deadline - now_seconds();
    return s <= 0 ? 0 : s > 1e6 ? 1000000000 : (int)(s * 1e3) + 1;
}

// HMAC-SHA256(token, nonce || rank as 4 big-endian bytes) into mac. 0, or -1 when libcrypto fails.
static int hello_mac(const char *token, const unsigned char *nonce, uint32_t rank,
                     unsigned char *mac) {
    unsigned char msg[NONCE_BYTES + 4];
    memcpy(msg, nonce, NONCE_BYTES);
    put_u32(msg + NONCE_BYTES, rank);
    unsigned int n = 0;
    return HMAC(EVP_sha256(), token, (int)strlen(token), msg, sizeof msg, mac, &n) && n == MAC_BYTES
               ? 0
               : -1;
}

static int crypto_error(int rank, char *err, size_t errlen) {
    char why[256];
    ERR_error_string_n(ERR_get_error(), why, sizeof why);
    return set_error(err, errlen,
                     "bootstrap: rank %d: libcrypto's HMAC-SHA256 failed (%s): check the OpenSSL "
                     "installation (libcrypto.so.3)",
                     rank, why);
}

static int random_bytes(unsigned char *p, size_t n) {
    while (n > 0) {
        const ssize_t k = getrandom(p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

// ---- moving bytes ----

// Moves the bytes [*done, len) of buf over non-blocking fd, out (send) or in (recv). 1 when all
// have moved, 0 when the socket would block, -1 on an error (errno) or a closed peer (errno 0).
static int pump(int fd, void *buf, size_t len, size_t *done, int out) {
    char *p = buf;
    while (*done < len) {
        const ssize_t k = out ? send(fd, p + *done, len - *done, MSG_NOSIGNAL)
                              : recv(fd, p + *done, len - *done, 0);
        if (k > 0) {
            *done += (size_t)k;
            continue;
        }
        if (k == 0) {
            errno = 0;
            return -1;
        }
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
    return 1;
}

// Moves len bytes over non-blocking fd in direction `out` before the deadline. 0, or -1.
static int transfer(int fd, void *buf, size_t len, int out, double deadline) {
    size_t done = 0;
    for (;;) {
        const int r = pump(fd, buf, len, &done, out);
        if (r != 0) return r > 0 ? 0 : -1;
        struct pollfd pfd = {.fd = fd, .events = out ? POLLOUT : POLLIN};
        const int k = poll(&pfd, 1, ms_left(deadline));
        if (k == 0 || (k < 0 && errno != EINTR)) return -1;
    }
}

// ---- addresses ----

static int loopback4(const struct in_addr *a) { return ntohl(a->s_addr) >> 24 == 127; }

static int loopback6(const struct in6_addr *a) {
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

static int sockaddr_is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET) return loopback4(&((const struct sockaddr_in *)sa)->sin_addr);
    if (sa->sa_family == AF_INET6) return loopback6(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    return 0;
}

int tcp_addr_is_loopback(const char *addr) {
    struct in_addr a4;
    struct in6_addr a6;
    if (strcasecmp(addr, "localhost") == 0) return 1;
    if (inet_pton(AF_INET, addr, &a4) == 1) return loopback4(&a4);
    return inet_pton(AF_INET6, addr, &a6) == 1 && loopback6(&a6);
}

// addr:port's addresses (a stream socket each) into *ai. 0, or getaddrinfo's code.
static int resolve(const char *addr, int port, struct addrinfo **ai) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    const struct addrinfo hints = {.ai_family = AF_UNSPEC,
                                   .ai_socktype = SOCK_STREAM,
                                   .ai_flags = AI_NUMERICSERV};
    return getaddrinfo(addr, service, &hints, ai);
}

// A non-blocking socket listening on sa, or -1 with errno set.
static int listen_on(const struct sockaddr *sa, socklen_t len) {
    const int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, sa, len) != 0 || listen(fd, SOMAXCONN) != 0) {
        const int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

// Listens on the first of addr's addresses that belongs to this host. -1 with errno
// EADDRNOTAVAIL when none does (or addr does not resolve here), with another errno when one
// does but cannot take the port.
static int listen_on_addr(const char *addr, int port) {
    struct addrinfo *ai = NULL;
    if (!addr || !*addr || resolve(addr, port, &ai) != 0) {
        errno = EADDRNOTAVAIL;
        return -1;
    }
    const int loopback_name = tcp_addr_is_loopback(addr);
    int fd = -1, e = EADDRNOTAVAIL;
    for (const struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        // A host name that this host's /etc/hosts maps to loopback (Debian's 127.0.1.1 for its
        // own name) resolves to a real address on the other hosts: listening on loopback would
        // shut them out, so such a name listens on every interface.
        if (!loopback_name && sockaddr_is_loopback(a->ai_addr)) continue;
        fd = listen_on(a->ai_addr, a->ai_addrlen);
        if (fd < 0 && errno != EADDRNOTAVAIL) e = errno;
    }
    freeaddrinfo(ai);
    if (fd < 0) errno = e;
    return fd;
}

// Rank 0's listener: on MASTER_ADDR's interface when it is this host's, else on every one.
static int open_listener(const TcpBootstrap *b, char *err, size_t errlen) {
    int fd = listen_on_addr(b->addr, b->port);
    if (fd < 0 && errno == EADDRNOTAVAIL) {
        const struct sockaddr_in any = {.sin_family = AF_INET,
                                        .sin_port = htons((uint16_t)b->port),
                                        .sin_addr.s_addr = htonl(INADDR_ANY)};
        fd = listen_on((const struct sockaddr *)&any, sizeof any);
    }
    if (fd < 0)
        return set_error(err, errlen,
                         "bootstrap: rank 0 cannot listen on port %d (MASTER_PORT + 1): "
                         "%s; choose another MASTER_PORT",
                         b->port, strerror(errno));
    return fd;
}

// ---- rank 0: many connections at once, each with its own deadline ----

typedef enum { PEER_FREE = 0, PEER_CHALLENGE, PEER_HELLO, PEER_ANSWER } PeerStage;

static const char *const STAGE_WHAT[] = {"", "the challenge", "its hello", "the answer"};

// One accepted connection, from its challenge to its answer or refusal.
typedef struct {
    int fd;
    PeerStage stage;
    double deadline;  // its own: a silent peer holds nothing but its slot, and only until then
    uint32_t rank;    // the rank it proved (PEER_ANSWER)
    size_t done;      // bytes of the current stage's message moved so far
    unsigned char challenge[CHALLENGE_BYTES];
    unsigned char hello[HELLO_BYTES];
    char name[PEER_NAME];
} Peer;

typedef struct {
    const TcpBootstrap *b;
    int fd;  // the listener
    Peer peers[MAX_PENDING];
    unsigned char *answer;  // the magic word and the bytes: the same for every rank
    size_t answer_len;
    char (*holder)[PEER_NAME];  // (world) the peer each rank was given to; "" while free
    int served;                 // ranks that received the answer, rank 0 included
} Server;

static void peer_close(Peer *p) {
    close(p->fd);
    p->stage = PEER_FREE;
}

// Closes p without (the rest of) an answer, frees the rank it held and says why on the log.
static void refuse(Server *s, Peer *p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void refuse(Server *s, Peer *p, const char *fmt, ...) {
    if (p->stage == PEER_ANSWER) s->holder[p->rank][0] = '\0';
    if (s->b->log) {
        char why[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof why, fmt, ap);
        va_end(ap);
        fprintf(s->b->log, "bootstrap: rank 0: dropped the connection from %s: %s\n", p->name, why);
        fflush(s->b->log);
    }
    peer_close(p);
}

static void peer_name(const struct sockaddr *sa, socklen_t len, char *name) {
    char host[NI_MAXHOST], port[NI_MAXSERV];
    if (getnameinfo(sa, len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        snprintf(name, PEER_NAME, "an unknown address");
    else
        snprintf(name, PEER_NAME, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
}

// Accepts the connections waiting on the listener while a slot is free; each gets a fresh
// nonce and its deadline. 0, or -1 with err set when no random bytes can be had.
static int accept_peers(Server *s, char *err, size_t errlen) {
    for (int i = 0; i < MAX_PENDING; i++) {
        Peer *p = &s->peers[i];
        if (p->stage != PEER_FREE) continue;
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        // An error other than "none left" (a connection reset while queued) concerns that one
        // connection: the next round takes the others.
        const int fd = accept4(s->fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return 0;
        *p = (Peer){.fd = fd, .stage = PEER_CHALLENGE,
                    .deadline = now_seconds() + TCP_HELLO_TIMEOUT_S};
        peer_name((struct sockaddr *)&sa, sl, p->name);
        put_u32(p->challenge, TCP_MAGIC);
        if (random_bytes(p->challenge + 4, NONCE_BYTES) != 0) {
            peer_close(p);
            return set_error(err, errlen,
                             "bootstrap: rank 0: no random bytes for a nonce (getrandom: %s)",
                             strerror(errno));
        }
    }
    return 0;
}

// A complete hello: p is given its rank when the hello proves the token for a rank of this
// world not given yet; else refused. 0, or -1 with err set when libcrypto fails.
static int check_hello(Server *s, Peer *p, char *err, size_t errlen) {
    const uint32_t rank = get_u32(p->hello + 4);
    unsigned char mac[MAC_BYTES];
    if (get_u32(p->hello) != TCP_MAGIC) {
        refuse(s, p, "not a flashgpt hello (wrong magic word)");
        return 0;
    }
    if (hello_mac(s->b->token, p->challenge + 4, rank, mac) != 0)
        return crypto_error(0, err, errlen);
    // The proof is checked before the rank is looked at, so that nothing about the ranks
    // given so far is told to a peer without the token.
    if (CRYPTO_memcmp(mac, p->hello + 8, MAC_BYTES) != 0)
        refuse(s, p, "wrong proof of the job token for rank %u (a process of another job, or "
                     "FLASHGPT_JOB_TOKEN differs from rank 0's)", rank);
    else if (rank == 0 || rank >= (uint32_t)s->b->world)
        refuse(s, p, "rank %u is not in 1..%d (WORLD_SIZE differs between ranks)", rank,
               s->b->world - 1);
    else if (s->holder[rank][0])
        refuse(s, p, "rank %u already arrived from %s (two processes claim that rank)", rank,
               s->holder[rank]);
    else {
        snprintf(s->holder[rank], PEER_NAME, "%s", p->name);
        p->stage = PEER_ANSWER, p->rank = rank, p->done = 0;
        p->deadline = now_seconds() + TCP_HELLO_TIMEOUT_S;
    }
    return 0;
}

// Moves p's exchange on as far as its socket allows. 0, or -1 with err set (libcrypto).
static int step_peer(Server *s, Peer *p, char *err, size_t errlen) {
    int r = 0;
    switch (p->stage) {
    case PEER_CHALLENGE:
        r = pump(p->fd, p->challenge, CHALLENGE_BYTES, &p->done, 1);
        if (r > 0) p->stage = PEER_HELLO, p->done = 0;
        break;
    case PEER_HELLO:
        r = pump(p->fd, p->hello, HELLO_BYTES, &p->done, 0);
        if (r > 0) return check_hello(s, p, err, errlen);
        break;
    case PEER_ANSWER:
        r = pump(p->fd, s->answer, s->answer_len, &p->done, 1);
        if (r > 0) s->served++, peer_close(p);
        break;
    default:
        break;
    }
    if (r < 0)
        refuse(s, p, "%s during %s", errno ? strerror(errno) : "it closed the connection",
               STAGE_WHAT[p->stage]);
    return 0;
}

// One poll over every connection and (while a slot is free) the listener, then their progress
// and the deadlines. 0, or -1 with err set.
static int serve_round(Server *s, double deadline, char *err, size_t errlen) {
    struct pollfd pfd[MAX_PENDING + 1];
    Peer *of[MAX_PENDING + 1];  // the connection of each pfd; NULL: the listener
    int n = 0;
    double wake = deadline;
    for (int i = 0; i < MAX_PENDING; i++) {
        Peer *p = &s->peers[i];
        if (p->stage == PEER_FREE) continue;
        pfd[n] = (struct pollfd){.fd = p->fd, .events = p->stage == PEER_HELLO ? POLLIN : POLLOUT};
        of[n++] = p;
        if (p->deadline < wake) wake = p->deadline;
    }
    // The listener goes last: connections accepted this round take slots freed this round,
    // after those slots' own events were handled.
    if (n < MAX_PENDING) pfd[n] = (struct pollfd){.fd = s->fd, .events = POLLIN}, of[n++] = NULL;
    if (poll(pfd, (nfds_t)n, ms_left(wake)) < 0 && errno != EINTR)
        return set_error(err, errlen, "bootstrap: rank 0: poll: %s", strerror(errno));
    for (int j = 0; j < n; j++) {
        if (!pfd[j].revents) continue;
        const int rc = of[j] ? step_peer(s, of[j], err, errlen) : accept_peers(s, err, errlen);
        if (rc != 0) return -1;
    }
    const double now = now_seconds();
    for (int i = 0; i < MAX_PENDING; i++) {
        Peer *p = &s->peers[i];
        if (p->stage != PEER_FREE && now >= p->deadline)
            refuse(s, p, "%s did not complete within %.0f s", STAGE_WHAT[p->stage],
                   TCP_HELLO_TIMEOUT_S);
    }
    return 0;
}

// The error naming the ranks that did not arrive.
static int missing_error(const Server *s, char *err, size_t errlen) {
    char missing[512] = "";
    size_t used = 0;
    for (int r = 1; r < s->b->world && used + 16 < sizeof missing; r++)
        if (!s->holder[r][0])
            used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                     used ? ", " : "", r);
    return set_error(err, errlen,
                     "bootstrap: rank 0: rank(s) %s of %d did not connect to port %d "
                     "within %.0f s: check that they started, that MASTER_ADDR names "
                     "this host and that the port is reachable",
                     missing, s->b->world, s->b->port, s->b->timeout_s);
}

// Rank 0: serves world - 1 ranks the bytes.
static int serve(const TcpBootstrap *b, const void *buf, size_t len, char *err, size_t errlen) {
    const double deadline = now_seconds() + b->timeout_s;
    Server *s = xcalloc(1, sizeof *s);
    s->b = b;
    s->fd = open_listener(b, err, errlen);
    if (s->fd < 0) {
        free(s);
        return -1;
    }
    s->answer_len = 4 + len;
    s->answer = xmalloc(s->answer_len);
    put_u32(s->answer, TCP_MAGIC);
    memcpy(s->answer + 4, buf, len);
    s->holder = xcalloc((size_t)b->world, PEER_NAME);
    snprintf(s->holder[0], PEER_NAME, "rank 0 itself");
    s->served = 1;
    int rc = 0;
    while (rc == 0 && s->served < b->world && now_seconds() < deadline)
        rc = serve_round(s, deadline, err, errlen);
    for (Peer *p = s->peers; p < s->peers + MAX_PENDING; p++)
        if (p->stage != PEER_FREE)
            refuse(s, p, "the bootstrap ended before %s did", STAGE_WHAT[p->stage]);
    close(s->fd);
    if (rc == 0 && s->served < b->world) rc = missing_error(s, err, errlen);
    free(s->holder);
    free(s->answer);
    free(s);
    return rc;
}

// ---- the other ranks ----

// One non-blocking connection attempt to ai before the deadline; the socket, or -1.
static int try_connect(const struct addrinfo *ai, double deadline) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
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

// On a connection to rank 0: its challenge, this rank's hello with the proof, the bytes. 0; -1
// when rank 0 refused this rank or is none (closed, another magic word); -2 when libcrypto failed.
static int exchange(int fd, const TcpBootstrap *b, void *buf, size_t len, double deadline) {
    unsigned char challenge[CHALLENGE_BYTES], hello[HELLO_BYTES], head[4];
    if (transfer(fd, challenge, sizeof challenge, 0, deadline) != 0 ||
        get_u32(challenge) != TCP_MAGIC)
        return -1;
    put_u32(hello, TCP_MAGIC);
    put_u32(hello + 4, (uint32_t)b->rank);
    if (hello_mac(b->token, challenge + 4, (uint32_t)b->rank, hello + 8) != 0) return -2;
    if (transfer(fd, hello, sizeof hello, 1, deadline) != 0 ||
        transfer(fd, head, sizeof head, 0, deadline) != 0 || get_u32(head) != TCP_MAGIC)
        return -1;
    return transfer(fd, buf, len, 0, deadline);
}

// Ranks > 0: connects to rank 0 (retrying while it starts), proves the token, reads the bytes.
static int fetch(const TcpBootstrap *b, void *buf, size_t len, char *err, size_t errlen) {
    const double deadline = now_seconds() + b->timeout_s;
    struct addrinfo *ai = NULL;
    const int gai = resolve(b->addr, b->port, &ai);
    if (gai != 0)
        return set_error(err, errlen, "bootstrap: rank %d: MASTER_ADDR '%s' does not resolve: %s",
                         b->rank, b->addr, gai_strerror(gai));
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
                         b->rank, b->addr, b->port, b->timeout_s);
    const int rc = exchange(fd, b, buf, len, deadline);
    close(fd);
    if (rc == -2) return crypto_error(b->rank, err, errlen);
    if (rc != 0)
        return set_error(err, errlen,
                         "bootstrap: rank %d: rank 0 at %s:%d refused this rank or closed the "
                         "connection (another rank %d running, a job token that differs from "
                         "rank 0's: FLASHGPT_JOB_TOKEN or the launcher's job id, or not a "
                         "flashgpt rank 0); rank 0's log names the reason",
                         b->rank, b->addr, b->port, b->rank);
    return 0;
}

int tcp_broadcast(const TcpBootstrap *b, void *buf, size_t len, char *err, size_t errlen) {
    if (b->world == 1) return 0;
    return b->rank == 0 ? serve(b, buf, len, err, errlen) : fetch(b, buf, len, err, errlen);
}
