/*
 * nouffd: runs a command the way a default container lets it run, as far
 * as userfaultfd goes.
 *
 *   nouffd [--enosys] [--] COMMAND [ARG...]
 *
 * A seccomp filter (inherited by every child, kept across exec) refuses:
 *
 *   - the userfaultfd(2) system call, with EPERM, as moby's default
 *     profile (profiles/seccomp/default.json), containerd's RuntimeDefault,
 *     CRI-O's and Podman's do;
 *   - ioctl(USERFAULTFD_IOC_NEW), with EPERM: a container is not given
 *     /dev/userfaultfd unless run with --device, so the device's way in
 *     is closed too.
 *
 * With --enosys both fail with ENOSYS instead, as under gVisor, which has
 * no userfaultfd at all. Everything else is allowed. The filter needs no
 * privilege (PR_SET_NO_NEW_PRIVS first), so it runs as any user.
 *
 * faultmap's ./scripts/test-all runs the engine-independent tests through
 * it, as root and as an unprivileged user: Docker is not available on the
 * machines the project is tested on, and this reproduces the one thing a
 * default container changes for faultmap.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

/* _IO(0xAA, 0x00), from include/uapi/linux/userfaultfd.h. */
#define USERFAULTFD_IOC_NEW 0xAA00u

#if defined(__x86_64__)
#define ARCH_NATIVE AUDIT_ARCH_X86_64
#define X32_SYSCALL_BIT 0x40000000u
#elif defined(__aarch64__)
#define ARCH_NATIVE AUDIT_ARCH_AARCH64
#else
#error "nouffd knows the system call numbers of x86-64 and aarch64 only"
#endif

/* The low 32 bits of a 64-bit system call argument. */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i))
#else
#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i) + 4)
#endif

static void usage(void) {
    fprintf(stderr, "usage: nouffd [--enosys] [--] COMMAND [ARG...]\n");
}

int main(int argc, char **argv) {
    unsigned int err = EPERM;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        } else if (strcmp(argv[i], "--enosys") == 0) {
            err = ENOSYS;
        } else {
            usage();
            return 2;
        }
    }
    if (i >= argc) {
        usage();
        return 2;
    }
    const unsigned int refuse = SECCOMP_RET_ERRNO | (err & SECCOMP_RET_DATA);
    struct sock_filter filter[] = {
        /* Another architecture's system calls (a 32-bit program): refuse
           them all rather than guess their numbers. */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH_NATIVE, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_userfaultfd, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, refuse),
#ifdef X32_SYSCALL_BIT
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, X32_SYSCALL_BIT | __NR_userfaultfd, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, refuse),
#endif
#ifdef X32_SYSCALL_BIT
        /* ioctl, or x32's (514 | the x32 bit): look at its request. */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ioctl, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, X32_SYSCALL_BIT | 514, 0, 3),
#else
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ioctl, 0, 3),
#endif
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(1)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, USERFAULTFD_IOC_NEW, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, refuse),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {
        .len = sizeof(filter) / sizeof(filter[0]),
        .filter = filter,
    };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        perror("nouffd: prctl(PR_SET_NO_NEW_PRIVS)");
        return 126;
    }
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        perror("nouffd: prctl(PR_SET_SECCOMP)");
        return 126;
    }
    execvp(argv[i], &argv[i]);
    fprintf(stderr, "nouffd: cannot run %s: %s\n", argv[i], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}
