// Package pageout asks the kernel to reclaim the resident pages of this
// process's mappings of a file: the pages a read-through mapping (bbolt's
// log file) touched once and keeps in the process's RSS long after.
//
// It must never lose data or change what a mapping reads. It only ever
// uses MADV_PAGEOUT, which reclaims and never discards: a clean file page
// is read back from the file on the next access, a dirty one is written
// back first, an anonymous one would be swapped. So an address range that
// was remapped between reading /proc/self/maps and the call is safe too.
package pageout

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// File asks the kernel to reclaim this process's pages of every mapping of
// path and returns how many bytes of mappings it advised.
func File(path string) (int64, error) {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, fmt.Errorf("pageout: %w", err)
	}
	var advised int64
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		start, end, ok := mappingOf(sc.Bytes(), path)
		if !ok {
			continue
		}
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, start, end-start, unix.MADV_PAGEOUT); errno != 0 {
			return advised, fmt.Errorf("pageout %s: madvise: %w", path, errno)
		}
		advised += int64(end - start)
	}
	return advised, nil
}

// mappingOf parses one line of /proc/self/maps ("start-end perms offset
// dev inode path") and reports the range when it maps path.
func mappingOf(line []byte, path string) (start, end uintptr, ok bool) {
	f := bytes.Fields(line)
	if len(f) < 6 || string(bytes.Join(f[5:], []byte(" "))) != path {
		return 0, 0, false
	}
	lo, hi, found := bytes.Cut(f[0], []byte("-"))
	if !found {
		return 0, 0, false
	}
	s, err1 := strconv.ParseUint(string(lo), 16, 64)
	e, err2 := strconv.ParseUint(string(hi), 16, 64)
	if err1 != nil || err2 != nil || e <= s {
		return 0, 0, false
	}
	return uintptr(s), uintptr(e), true
}
