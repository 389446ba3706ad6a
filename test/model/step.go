package model

import (
	"sort"
	"strings"
	"syscall"
)

// stepData is the specification of one data file whose contents are s.
// Definite errors are never legal here: the workload keeps data files in
// place, so a failed mutation must be recorded as Unknown.
func stepData(s string, in Input, out Output) (bool, interface{}) {
	if out.Err != 0 && !out.Unknown {
		return false, s
	}
	switch in.Kind {
	case KindWrite:
		if !out.Unknown && out.N != int64(len(in.Data)) {
			return false, s
		}
		return true, writeAt(s, in.Off, in.Data)
	case KindAppend:
		if !out.Unknown && out.N != int64(len(in.Data)) {
			return false, s
		}
		return true, s + in.Data
	case KindRead:
		return out.Unknown || out.Data == readAt(s, in.Off, in.Len), s
	case KindSize:
		return out.Unknown || out.N == int64(len(s)), s
	}
	return false, s
}

// writeAt is pwrite on a byte string: a gap past the end reads as zeros.
func writeAt(s string, off int64, data string) string {
	if off < 0 {
		return s
	}
	end := off + int64(len(data))
	var b strings.Builder
	b.Grow(int(max(end, int64(len(s)))))
	if off <= int64(len(s)) {
		b.WriteString(s[:off])
	} else {
		b.WriteString(s)
		b.WriteString(strings.Repeat("\x00", int(off)-len(s)))
	}
	b.WriteString(data)
	if end < int64(len(s)) {
		b.WriteString(s[end:])
	}
	return b.String()
}

func readAt(s string, off int64, n int) string {
	if off < 0 || off >= int64(len(s)) || n <= 0 {
		return ""
	}
	end := min(off+int64(n), int64(len(s)))
	return s[off:end]
}

// nsState is one namespace group: slot i < len(Top) is Top[i], slot
// len(Top)+i is Top[i]/Child. A slot is 0 when the name is absent.
type nsState [2 * len(Top)]uint16

const (
	present  = 0x8000
	dirBit   = 0x4000
	permMask = 0o777
)

func (g nsState) String() string {
	var parts []string
	for i, p := range NSPaths() {
		v := g[i]
		if v == 0 {
			continue
		}
		if v&dirBit != 0 {
			parts = append(parts, p+"/")
		} else {
			parts = append(parts, p+":"+strconvOct(uint32(v&permMask)))
		}
	}
	if len(parts) == 0 {
		return "{}"
	}
	return "{" + strings.Join(parts, " ") + "}"
}

func strconvOct(v uint32) string {
	const digits = "01234567"
	return string([]byte{digits[v>>6&7], digits[v>>3&7], digits[v&7]})
}

// slot returns the slot of a relative path, whether it is a child path, and
// false when the path is not one the model knows.
func slot(p string) (int, bool, bool) {
	for i, t := range Top {
		if p == t {
			return i, false, true
		}
		if p == t+"/"+Child {
			return len(Top) + i, true, true
		}
	}
	return 0, false, false
}

type errSet []syscall.Errno

func (s errSet) has(e syscall.Errno) bool {
	for _, x := range s {
		if x == e {
			return true
		}
	}
	return false
}

// parentErrs are the errors of resolving the directory that holds slot i.
func (g nsState) parentErrs(i int, child bool) errSet {
	if !child {
		return nil
	}
	parent := g[i-len(Top)]
	switch {
	case parent == 0:
		return errSet{syscall.ENOENT}
	case parent&dirBit == 0:
		return errSet{syscall.ENOTDIR}
	}
	return nil
}

func (g nsState) nonEmptyDir(i int, child bool) bool {
	return !child && g[i]&dirBit != 0 && g[len(Top)+i] != 0
}

// stepNS is the specification of one namespace group. An operation is
// legal if it succeeded where no error applies, or failed with one of the
// errors that apply (POSIX lets any of several applicable errors be
// reported).
func stepNS(g nsState, in Input, out Output) (bool, interface{}) {
	errs, next, ok := g.apply(in)
	if !ok {
		return false, g
	}
	if out.Unknown {
		if len(errs) > 0 {
			return true, g
		}
		return true, next
	}
	if out.Err != 0 {
		return errs.has(out.Err), g
	}
	if len(errs) > 0 {
		return false, g
	}
	return g.outputMatches(in, out), next
}

// apply computes the errors that apply to in and the state it leads to
// when none does. ok is false for an input the model cannot express.
func (g nsState) apply(in Input) (errSet, nsState, bool) {
	if in.Kind == KindReadDir && in.Path == "" {
		return nil, g, true
	}
	i, child, known := slot(in.Path)
	if !known {
		return nil, g, false
	}
	errs := g.parentErrs(i, child)
	exists := len(errs) == 0 && g[i] != 0
	switch in.Kind {
	case KindCreate, KindMkdir:
		if len(errs) == 0 && exists {
			errs = append(errs, syscall.EEXIST)
		}
		if len(errs) > 0 {
			return errs, g, true
		}
		next := g
		next[i] = present | uint16(in.Perm&permMask)
		if in.Kind == KindMkdir {
			next[i] |= dirBit
		}
		return nil, next, true
	case KindRemove:
		if len(errs) == 0 && !exists {
			errs = append(errs, syscall.ENOENT)
		}
		if exists && g.nonEmptyDir(i, child) {
			errs = append(errs, syscall.ENOTEMPTY, syscall.EEXIST)
		}
		if len(errs) > 0 {
			return errs, g, true
		}
		next := g
		next[i] = 0
		return nil, next, true
	case KindRename:
		return g.rename(in, i, child, errs)
	case KindStat, KindReadDir, KindChmod:
		if len(errs) == 0 && !exists {
			errs = append(errs, syscall.ENOENT)
		}
		if in.Kind == KindReadDir && exists && g[i]&dirBit == 0 {
			errs = append(errs, syscall.ENOTDIR)
		}
		if len(errs) > 0 || in.Kind != KindChmod {
			return errs, g, true
		}
		next := g
		next[i] = g[i]&^permMask | uint16(in.Perm&permMask)
		return nil, next, true
	}
	return nil, g, false
}

// rename moves src (slot i) to dst. The workload only renames within one
// level (top to top, child to child) so that the tree keeps its shape.
func (g nsState) rename(in Input, i int, child bool, errs errSet) (errSet, nsState, bool) {
	j, dchild, known := slot(in.Path2)
	if !known || child != dchild {
		return nil, g, false
	}
	errs = append(errs, g.parentErrs(j, dchild)...)
	srcOK := len(g.parentErrs(i, child)) == 0
	if srcOK && g[i] == 0 {
		errs = append(errs, syscall.ENOENT)
	}
	dstOK := len(g.parentErrs(j, dchild)) == 0
	if srcOK && dstOK && g[i] != 0 && g[j] != 0 && i != j {
		srcDir, dstDir := g[i]&dirBit != 0, g[j]&dirBit != 0
		switch {
		case srcDir && !dstDir:
			errs = append(errs, syscall.ENOTDIR)
		case !srcDir && dstDir:
			errs = append(errs, syscall.EISDIR)
		case dstDir && g.nonEmptyDir(j, dchild):
			errs = append(errs, syscall.ENOTEMPTY, syscall.EEXIST)
		}
	}
	if len(errs) > 0 || i == j {
		return errs, g, true
	}
	next := g
	next[j], next[i] = g[i], 0
	if !child {
		// A directory moves with its entry.
		next[len(Top)+j], next[len(Top)+i] = g[len(Top)+i], 0
	}
	return nil, next, true
}

func (g nsState) outputMatches(in Input, out Output) bool {
	switch in.Kind {
	case KindStat:
		i, _, _ := slot(in.Path)
		isDir := g[i]&dirBit != 0
		if out.Dir != isDir {
			return false
		}
		return isDir || out.Perm&permMask == uint32(g[i]&permMask)
	case KindReadDir:
		want := g.list(in.Path)
		got := append([]string(nil), out.Names...)
		sort.Strings(got)
		if len(got) != len(want) {
			return false
		}
		for k := range got {
			if got[k] != want[k] {
				return false
			}
		}
	}
	return true
}

// list is the sorted listing of a directory of the group: "name" for a
// file, "name/" for a directory.
func (g nsState) list(dir string) []string {
	var out []string
	add := func(name string, v uint16) {
		if v == 0 {
			return
		}
		if v&dirBit != 0 {
			name += "/"
		}
		out = append(out, name)
	}
	if dir == "" {
		for i, t := range Top {
			add(t, g[i])
		}
	} else if i, child, _ := slot(dir); !child {
		add(Child, g[len(Top)+i])
	}
	sort.Strings(out)
	return out
}
