// Package hugepages lets this process's Go heap be backed by transparent
// huge pages on a system whose setting is "madvise".
//
// The Go runtime leaves huge pages to the system setting, and "madvise"
// gives a Go heap only 4 KiB pages. A node that keeps its data in memory
// touches every page of a growing heap once, and where a page fault is dear
// (a virtual machine that shadows page tables in software charges tens of
// microseconds for one, against well under one on bare metal) those faults
// cost more than the writes themselves. One fault per 2 MiB instead of one
// per 4 KiB removes most of that cost (docs/benchmarks.md, "Page faults").
//
// Reserve works by letting the runtime map a range of address space for one
// large allocation it never touches, advising that range, and freeing the
// allocation: the runtime keeps the range as free heap and never unmaps it,
// so the heap's later growth into it is faulted in huge pages. The package
// never reads or writes that memory, and it costs address space, not RAM.
package hugepages

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// hugePage is the smallest mapping worth advising.
const hugePage = 2 << 20

// System is what Plan needs to know of the machine.
type System struct {
	Mode       string // transparent huge pages: "always", "madvise" or "never"
	Overcommit string // vm.overcommit_memory: "0", "1" or "2"
	DisableTHP bool   // GODEBUG=disablethp=1: the runtime itself opts out
	RlimitSet  bool   // RLIMIT_AS or RLIMIT_DATA caps this process's mappings
	RAM        uint64 // bytes of memory the kernel manages
}

// ReadSystem reads the settings Plan needs from /sys and /proc.
func ReadSystem() (System, error) {
	var s System
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		return s, fmt.Errorf("hugepages: %w", err)
	}
	if s.Mode = selected(string(b)); s.Mode == "" {
		return s, fmt.Errorf("hugepages: cannot parse %q", b)
	}
	if b, err = os.ReadFile("/proc/sys/vm/overcommit_memory"); err != nil {
		return s, fmt.Errorf("hugepages: %w", err)
	}
	s.Overcommit = strings.TrimSpace(string(b))
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return s, fmt.Errorf("hugepages: sysinfo: %w", err)
	}
	s.RAM = uint64(si.Totalram) * uint64(si.Unit)
	s.DisableTHP = strings.Contains(","+os.Getenv("GODEBUG")+",", ",disablethp=1,")
	for _, res := range []int{unix.RLIMIT_AS, unix.RLIMIT_DATA} {
		var lim unix.Rlimit
		if err := unix.Getrlimit(res, &lim); err != nil || lim.Cur != unix.RLIM_INFINITY {
			s.RlimitSet = true
		}
	}
	return s, nil
}

// Plan says how many bytes Reserve should reserve for a heap expected to
// reach want, or why none.
func Plan(s System, want uint64) (uint64, string) {
	switch {
	case s.DisableTHP:
		return 0, "GODEBUG=disablethp=1"
	case s.Mode == "always":
		return 0, "the system already gives every mapping huge pages"
	case s.Mode != "madvise":
		return 0, "the system gives no huge pages (" + s.Mode + ")"
	case s.RlimitSet:
		// Reserved address space counts against these limits too.
		return 0, "RLIMIT_AS or RLIMIT_DATA is set and would count the reservation"
	case s.Overcommit == "2":
		// Strict accounting charges the reservation as if it were used. A
		// refused mapping is fatal to the runtime, so never risk one.
		return 0, "vm.overcommit_memory=2 would charge the reservation"
	}
	// Heuristic overcommit refuses a single mapping larger than RAM; stay
	// well inside it.
	size := min(want, s.RAM/2) &^ (hugePage - 1)
	if size == 0 {
		return 0, "less than one huge page to reserve"
	}
	return size, ""
}

// Reserve makes the next size bytes of heap growth huge-page backed and
// returns the bytes of mappings it advised. Call it once, early, before the
// heap has grown.
func Reserve(size uint64) (int64, error) {
	if size < hugePage {
		return 0, nil
	}
	// Fresh memory from the OS is known to be zero, so the runtime neither
	// clears nor touches it: this maps size bytes and faults in none.
	ballast := make([]byte, size)
	n, err := adviseAll()
	runtime.KeepAlive(ballast) // the last use: the collection below frees it
	runtime.GC()               // returns the range to the heap's free pages
	return n, err
}

// adviseAll advises every private anonymous read-write mapping of at least
// one huge page and returns how many bytes that covered.
func adviseAll() (int64, error) {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, fmt.Errorf("hugepages: %w", err)
	}
	var total int64
	var errs []error
	for _, r := range anonRanges(maps) {
		if err := madvise(r.start, r.end-r.start); err != nil {
			errs = append(errs, fmt.Errorf("hugepages: madvise %#x-%#x: %w", r.start, r.end, err))
			continue
		}
		total += int64(r.end - r.start)
	}
	return total, errors.Join(errs...)
}

// madvise takes the range as numbers, not a slice: it is this process's
// own memory, read off /proc/self/maps, and is never touched.
func madvise(addr, n uintptr) error {
	if _, _, e := unix.Syscall(unix.SYS_MADVISE, addr, n, unix.MADV_HUGEPAGE); e != 0 {
		return e
	}
	return nil
}

type addrRange struct{ start, end uintptr }

// anonRanges picks the lines of a /proc/PID/maps that are private,
// read-write, name no file and span at least one huge page.
func anonRanges(maps []byte) []addrRange {
	var out []addrRange
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 5 || f[1] != "rw-p" || f[4] != "0" {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, startErr := strconv.ParseUint(lo, 16, 64)
		end, endErr := strconv.ParseUint(hi, 16, 64)
		if startErr != nil || endErr != nil || end < start || end-start < hugePage {
			continue
		}
		out = append(out, addrRange{uintptr(start), uintptr(end)})
	}
	return out
}

// selected returns the bracketed choice of a /sys setting such as
// "always [madvise] never".
func selected(s string) string {
	for _, f := range strings.Fields(s) {
		if len(f) > 2 && f[0] == '[' && f[len(f)-1] == ']' {
			return f[1 : len(f)-1]
		}
	}
	return ""
}
