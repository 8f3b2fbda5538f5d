/* A delay line between two TUN devices: the benchmarks' round trip time (links.py).

   This machine's kernel has no sch_netem, so tc cannot delay packets; this program does
   what netem's `delay` would. It opens the TUN device HOST_DEV in its own network
   namespace and NS_DEV in the namespace at NETNS_PATH, both with offloads on (virtio-net
   headers: the kernel hands over whole GSO packets of up to 64 KiB, so TCP still runs
   1500-byte segments while the line moves a few thousand packets a second), and forwards
   every packet read from one to the other DELAY_US microseconds later, in order. Rate
   caps stay the kernel's (tbf on either device, set by the caller).

   usage: delayline NETNS_PATH HOST_DEV NS_DEV DELAY_US
   It prints "ready" once both devices exist, and runs until killed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define PACKET_MAX (65536 + 64) /* a GSO packet and its virtio-net header */
#define SLOTS 65536             /* packets in flight per direction, at most */

struct packet {
    uint64_t due_us;
    ssize_t length;
    unsigned char *bytes;
};

struct line {
    int from, to;
    struct packet slots[SLOTS];
    size_t head, count;
};

static uint64_t now_us(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u;
}

static int open_tun(const char *name) {
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        perror("open /dev/net/tun");
        exit(1);
    }
    struct ifreq request;
    memset(&request, 0, sizeof request);
    request.ifr_flags = IFF_TUN | IFF_NO_PI | IFF_VNET_HDR;
    strncpy(request.ifr_name, name, IFNAMSIZ - 1);
    if (ioctl(fd, TUNSETIFF, &request) < 0) {
        perror("TUNSETIFF");
        exit(1);
    }
    int header = 12; /* struct virtio_net_hdr_v1 */
    unsigned offloads = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
    if (ioctl(fd, TUNSETVNETHDRSZ, &header) < 0 || ioctl(fd, TUNSETOFFLOAD, offloads) < 0) {
        perror("TUNSETOFFLOAD");
        exit(1);
    }
    return fd;
}

/* Read what is waiting on the line's source, each packet due `delay` from now. */
static void take(struct line *line, uint64_t delay) {
    static unsigned char buffer[PACKET_MAX];
    while (line->count < SLOTS) {
        ssize_t length = read(line->from, buffer, sizeof buffer);
        if (length < 0) {
            if (errno == EAGAIN || errno == EINTR) return;
            perror("read");
            exit(1);
        }
        struct packet *slot = &line->slots[(line->head + line->count) % SLOTS];
        if ((slot->bytes = malloc((size_t)length)) == NULL) {
            perror("malloc");
            exit(1);
        }
        memcpy(slot->bytes, buffer, (size_t)length);
        slot->length = length;
        slot->due_us = now_us() + delay;
        line->count++;
    }
}

/* Write every packet now due; a full device queue drops it, as a wire would. */
static void give(struct line *line, uint64_t now) {
    while (line->count > 0 && line->slots[line->head].due_us <= now) {
        struct packet *slot = &line->slots[line->head];
        if (write(line->to, slot->bytes, (size_t)slot->length) < 0 && errno != EAGAIN &&
            errno != ENOBUFS && errno != EIO) {
            perror("write");
            exit(1);
        }
        free(slot->bytes);
        line->head = (line->head + 1) % SLOTS;
        line->count--;
    }
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s NETNS_PATH HOST_DEV NS_DEV DELAY_US\n", argv[0]);
        return 2;
    }
    uint64_t delay = strtoull(argv[4], NULL, 10);
    int host = open_tun(argv[2]);
    int namespace = open(argv[1], O_RDONLY | O_CLOEXEC);
    if (namespace < 0 || setns(namespace, CLONE_NEWNET) < 0) {
        perror("setns");
        return 1;
    }
    int inside = open_tun(argv[3]);
    static struct line lines[2];
    lines[0].from = host, lines[0].to = inside;
    lines[1].from = inside, lines[1].to = host;
    printf("ready\n");
    fflush(stdout);
    struct pollfd watched[2] = {{host, POLLIN, 0}, {inside, POLLIN, 0}};
    for (;;) {
        uint64_t now = now_us();
        uint64_t wait = UINT64_MAX;
        for (int index = 0; index < 2; index++) {
            struct line *line = &lines[index];
            give(line, now);
            if (line->count > 0 && line->slots[line->head].due_us - now < wait) {
                wait = line->slots[line->head].due_us - now;
            }
        }
        struct timespec timeout = {(time_t)(wait / 1000000u), (long)(wait % 1000000u) * 1000};
        if (ppoll(watched, 2, wait == UINT64_MAX ? NULL : &timeout, NULL) < 0 && errno != EINTR) {
            perror("poll");
            return 1;
        }
        for (int index = 0; index < 2; index++) {
            if (watched[index].revents & POLLIN) take(&lines[index], delay);
        }
    }
}
