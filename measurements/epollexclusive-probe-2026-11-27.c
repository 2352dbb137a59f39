#define _GNU_SOURCE
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <time.h>
#include <errno.h>
static int uffd, stopfd, mode, nh;
static size_t len = 64<<20;
static void *handler(void *arg) {
  long cpu = (long)arg;
  if (cpu >= 0) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
  int ep = -1;
  if (mode == 1) {
    ep = epoll_create1(0);
    struct epoll_event e = { .events = EPOLLIN | EPOLLEXCLUSIVE, .data.u32 = 0 };
    if (epoll_ctl(ep, EPOLL_CTL_ADD, uffd, &e)) { perror("ctl"); exit(1); }
    struct epoll_event e2 = { .events = EPOLLIN, .data.u32 = 1 };
    epoll_ctl(ep, EPOLL_CTL_ADD, stopfd, &e2);
  }
  for (;;) {
    struct uffd_msg m;
    for (;;) {
      ssize_t n = read(uffd, &m, sizeof m);
      if (n != sizeof m) break;
      if (m.event != UFFD_EVENT_PAGEFAULT) continue;
      struct uffdio_continue c = { .range = { m.arg.pagefault.address & ~4095UL, 4096 } };
      if (ioctl(uffd, UFFDIO_CONTINUE, &c) && errno == EEXIST) {
        struct uffdio_range r = { m.arg.pagefault.address & ~4095UL, 4096 }; ioctl(uffd, UFFDIO_WAKE, &r);
      }
    }
    if (mode == 1) {
      struct epoll_event ev[2]; int k = epoll_wait(ep, ev, 2, -1);
      for (int i = 0; i < k; i++) if (ev[i].data.u32 == 1) return 0;
    } else {
      struct pollfd p[2] = { { uffd, POLLIN }, { stopfd, POLLIN } };
      poll(p, 2, -1);
      if (p[1].revents) return 0;
    }
  }
}
int main(int argc, char **argv) {
  mode = atoi(argv[1]); nh = atoi(argv[2]); int pin = atoi(argv[3]);
  int fd = memfd_create("x", 0); ftruncate(fd, len);
  char *w = mmap(0, len, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0); memset(w, 1, len); munmap(w, len);
  uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_MINOR_SHMEM };
  if (ioctl(uffd, UFFDIO_API, &api)) { perror("api"); return 1; }
  stopfd = eventfd(0, 0);
  pthread_t t[8];
  for (long i = 0; i < nh; i++) pthread_create(&t[i], 0, handler, (void*)(pin ? i : -1));
  double best = 1e9, sum = 0; int reps = 5;
  for (int r = 0; r < reps; r++) {
    char *p = mmap(0, len, PROT_READ, MAP_SHARED, fd, 0);
    struct uffdio_register reg = { .range = { (unsigned long)p, len }, .mode = UFFDIO_REGISTER_MODE_MINOR };
    if (ioctl(uffd, UFFDIO_REGISTER, &reg)) { perror("reg"); return 1; }
    struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
    volatile char s = 0; for (size_t o = 0; o < len; o += 4096) s += p[o];
    clock_gettime(CLOCK_MONOTONIC, &b);
    double us = ((b.tv_sec-a.tv_sec)*1e9 + (b.tv_nsec-a.tv_nsec)) / 1e3 / (len/4096);
    sum += us; if (us < best) best = us;
    munmap(p, len);
  }
  printf("mode=%s handlers=%d pin=%d  best %.2f us/fault  mean %.2f\n", mode ? "epollex" : "poll", nh, pin, best, sum/reps);
  uint64_t one = 1; write(stopfd, &one, 8);
  for (int i = 0; i < nh; i++) pthread_join(t[i], 0);
}
