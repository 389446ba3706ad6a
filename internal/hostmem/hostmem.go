// Package hostmem tells how much memory this process can have at most: the
// machine's RAM, or less where a memory cgroup (v1 or v2) caps it. A node refuses a
// memory limit larger than that, which the kernel's OOM killer would end
// before the node ever answered ENOSPC.
//
// It only reads /proc and the cgroup file systems; it must never change a
// limit.
package hostmem

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Limit is what the host can back, and what sets it.
type Limit struct {
	Bytes  uint64
	Source string // "MemTotal" or the memory.max file of the tightest cgroup
}

// Root is where the cgroup file systems are mounted: cgroup v2 at Root,
// or the v1 memory controller at Root/memory (a hybrid host has both,
// with memory in v1). Tests point it elsewhere.
var Root = "/sys/fs/cgroup"

// Read returns the smaller of MemTotal and every memory limit from this
// process's cgroups up to their roots.
func Read() (Limit, error) { return read("/proc/meminfo", "/proc/self/cgroup") }

func read(meminfo, cgroups string) (Limit, error) {
	total, err := memTotal(meminfo)
	if err != nil {
		return Limit{}, err
	}
	l := Limit{Bytes: total, Source: "MemTotal"}
	b, err := os.ReadFile(cgroups)
	if err != nil {
		return l, nil // no cgroups: the machine's RAM is the limit
	}
	for _, line := range strings.Split(string(b), "\n") {
		// "0::/path" is cgroup v2; "N:memory:/path" the v1 controller
		// (several controllers may share a line: "N:cpu,memory:/path").
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			l = tightest(l, Root, parts[2], "memory.max")
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			l = tightest(l, filepath.Join(Root, "memory"), parts[2], "memory.limit_in_bytes")
		}
	}
	return l, nil
}

// tightest lowers l to any limit in file from the cgroup at root+path up
// to root. A value that is not a number ("max") or exceeds l is no limit.
func tightest(l Limit, root, path, file string) Limit {
	root = filepath.Clean(root)
	for dir := filepath.Join(root, filepath.Clean("/"+path)); ; dir = filepath.Dir(dir) {
		f := filepath.Join(dir, file)
		if b, err := os.ReadFile(f); err == nil {
			if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && n < l.Bytes {
				l = Limit{Bytes: n, Source: f}
			}
		}
		if len(dir) <= len(root) {
			return l
		}
	}
}

// memTotal reads MemTotal from a meminfo file.
func memTotal(file string) (uint64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("hostmem: MemTotal: %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("hostmem: no MemTotal in " + file)
}
