package kvmguest

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The test guest runs a handful of instructions. It is given up on when
// its thread has spent CPUBudget of CPU time in KVM_RUN without the guest
// ending (a spinning or re-faulting vCPU), or after WallLimit however little
// CPU it got (a vCPU that never runs). Both are bounds on evidence, not on
// patience: a loaded machine slows the wall clock, not the CPU time a guest
// needs, and an expired bound answers "not usable", the safe side. (The
// bound was 5 s of wall time; an aarch64 guest under TCG on a loaded
// two-core machine can take that long just to be scheduled.)
const (
	CPUBudget = 10 * time.Second
	WallLimit = 2 * time.Minute
)

// Run creates a VM on dev (normally /dev/kvm) and runs the architecture's
// test guest to its end: nil means KVM ran the guest's code. A /dev/kvm that
// answers the API but cannot run code is not usable, and neither is one
// whose guest does not end within the bounds above.
func Run(dev string) error {
	return bounded(func(stop *atomic.Bool) error { return runGuest(dev, stop) }, CPUBudget, WallLimit)
}

// bounded runs f on an OS thread of its own and returns its error, or an
// error once that thread has used cpu of CPU time or wall has passed. Then
// it sets f's stop flag and interrupts the thread (a signal makes KVM_RUN
// return EINTR), so that a guest that does not end is not entered again:
// a vCPU left spinning would cost a core for as long as the agent runs.
func bounded(f func(stop *atomic.Bool) error, cpu, wall time.Duration) error {
	tid := make(chan int, 1)
	done := make(chan error, 1)
	var stop atomic.Bool
	go func() {
		// Never unlocked: the thread ends with the goroutine, so no other
		// goroutine inherits a thread that ran a vCPU.
		runtime.LockOSThread()
		tid <- unix.Gettid()
		done <- f(&stop)
	}()
	thread := <-tid
	giveUp := func(err error) error {
		stop.Store(true)
		// SIGURG: the Go runtime's own preemption signal, which it
		// ignores when it did not send it.
		_ = unix.Tgkill(unix.Getpid(), thread, unix.SIGURG)
		return err
	}
	clock := threadCPUClock(thread)
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
		}
		used := cpuTime(clock)
		switch {
		case used >= cpu:
			return giveUp(fmt.Errorf("KVM_RUN: the test guest did not end after %s of CPU time", used.Round(time.Millisecond)))
		case time.Since(start) >= wall:
			return giveUp(fmt.Errorf("KVM_RUN: the test guest did not end within %s (its vCPU used %s of CPU time)", wall, used.Round(time.Millisecond)))
		}
	}
}

// threadCPUClock is the clock ID of one thread's CPU time in this process
// (the kernel's MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED), what glibc's
// pthread_getcpuclockid returns): time on a CPU, guest mode included.
func threadCPUClock(tid int) int32 { return int32(^tid<<3 | 4 | 2) }

// cpuTime reads a CPU-time clock; a thread that has ended reads as zero
// (its result is already on its way).
func cpuTime(clock int32) time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(clock, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
