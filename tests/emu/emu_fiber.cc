/*
 * emu_fiber.cc: fibers for the emulated device, one per CUDA thread of the
 * block that runs (up to 1024), so that a thread can stop at a barrier or a
 * warp operation and the others go on until they meet it.
 *
 * A fiber has a stack of its own (mmap'd, with a guard page under it: an
 * overflow faults instead of writing into another stack) and runs `entry`,
 * which never returns: it runs CUDA threads one after the other, switching
 * back to the scheduler after each. The switch on x86-64 is a few
 * instructions (callee-saved registers, the stack pointer, the SSE and x87
 * control words), not swapcontext, which makes a system call for the signal
 * mask at each switch; elsewhere it is ucontext. Under AddressSanitizer each
 * switch is announced (__sanitizer_start/finish_switch_fiber) so that ASan
 * knows which stack is live, and a fiber reset has its stack unpoisoned (a
 * kernel abandoned at a deadlock leaves redzones in it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "tests/emu/emu.h"

#if defined(__SANITIZE_ADDRESS__)
#define MP_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MP_EMU_ASAN 1
#endif
#endif
#ifdef MP_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define STACK_BYTES ((size_t)512 << 10)   /* ASan's redzones make frames larger */
#else
#define STACK_BYTES ((size_t)128 << 10)
#endif
#define GUARD ((size_t)4096)

#if defined(__x86_64__) && !defined(MP_EMU_UCONTEXT)
/* mp_emu_switch(&save, load): pushes the callee-saved registers and the
 * control words, saves the stack pointer in *save, loads `load`, pops its
 * registers and returns into that fiber */
extern "C" void mp_emu_switch(void **save, void *load);
__asm__(".text\n"
        ".globl mp_emu_switch\n"
        ".hidden mp_emu_switch\n"
        ".type mp_emu_switch,@function\n"
        "mp_emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size mp_emu_switch, .-mp_emu_switch\n");
#define FAST_SWITCH 1
#else
#include <ucontext.h>
#endif

namespace mp_emu {

struct fiber {
    char *stack;                 /* lowest usable byte */
    size_t size;
    void (*entry)(void);
#ifdef FAST_SWITCH
    void *sp;
#else
    ucontext_t uc;
#endif
    void *fake_stack;            /* ASan's, for this fiber */
};

static fiber *running;           /* the fiber switched to, or NULL in the scheduler */
#ifdef FAST_SWITCH
static void *sched_sp;
#else
static ucontext_t sched_uc;
#endif
#ifdef MP_EMU_ASAN
static void *sched_fake;
static const void *sched_bottom;   /* the scheduler's stack, as ASan reports it */
static size_t sched_size;
#endif

static void start(void)
{
#ifdef MP_EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &sched_bottom, &sched_size);
#endif
    running->entry();
    abort();   /* entry never returns */
}

static void prepare(fiber *f)
{
#ifdef MP_EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(f->stack, f->size);
#endif
#ifdef FAST_SWITCH
    /* the frame mp_emu_switch pops: control words, six registers, then `start`
     * as the return address, above it a dummy one so that start begins with
     * the stack aligned as after a call */
    uint64_t *top = (uint64_t *)(f->stack + f->size);
    uint32_t mxcsr;
    uint16_t fpucw;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fpucw));
    top[-1] = 0;
    top[-2] = (uint64_t)(uintptr_t)&start;
    for (int i = 3; i <= 8; i++) top[-i] = 0;
    top[-9] = (uint64_t)mxcsr | (uint64_t)fpucw << 32;
    f->sp = &top[-9];
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = f->size;
    f->uc.uc_link = NULL;
    makecontext(&f->uc, start, 0);
#endif
    f->fake_stack = NULL;
}

fiber *fiber_new(void (*entry)(void))
{
    char *m = (char *)mmap(NULL, STACK_BYTES + GUARD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                           -1, 0);
    if (m == MAP_FAILED) {
        perror("mp-emu: a fiber's stack");
        abort();
    }
    mprotect(m, GUARD, PROT_NONE);   /* the stack grows down into it */
    fiber *f = new fiber();
    f->stack = m + GUARD;
    f->size = STACK_BYTES;
    f->entry = entry;
    prepare(f);
    return f;
}

void fiber_reset(fiber *f) { prepare(f); }

void switch_to(fiber *f)
{
    running = f;
#ifdef MP_EMU_ASAN
    __sanitizer_start_switch_fiber(&sched_fake, f->stack, f->size);
#endif
#ifdef FAST_SWITCH
    mp_emu_switch(&sched_sp, f->sp);
#else
    swapcontext(&sched_uc, &f->uc);
#endif
#ifdef MP_EMU_ASAN
    __sanitizer_finish_switch_fiber(sched_fake, NULL, NULL);
#endif
    running = NULL;
}

void switch_back(fiber *f)
{
#ifdef MP_EMU_ASAN
    __sanitizer_start_switch_fiber(&f->fake_stack, sched_bottom, sched_size);
#endif
#ifdef FAST_SWITCH
    mp_emu_switch(&f->sp, sched_sp);
#else
    swapcontext(&f->uc, &sched_uc);
#endif
#ifdef MP_EMU_ASAN
    __sanitizer_finish_switch_fiber(f->fake_stack, &sched_bottom, &sched_size);
#endif
}

}  // namespace mp_emu
