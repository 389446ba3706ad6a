// Package model is the sequential specification of the MemoryFS operations
// that the chaos tests exercise, written as a porcupine model, plus the
// recorder that turns concurrent client calls into a porcupine history and
// the checker that saves a violating history with its visualisation.
//
// The key space is split so that porcupine can check each part on its own:
//   - data files (KindWrite, KindAppend, KindRead, KindSize): one file per
//     key, the state is its contents;
//   - namespace groups (KindCreate, KindMkdir, KindRemove, KindRename,
//     KindReadDir, KindStat, KindChmod): one directory per key holding the
//     names in Top and, under each of them when it is a directory, Child.
//
// The model never talks to a cluster and must never import one: it is pure
// so that its own unit tests can feed it hand-made histories.
package model

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"syscall"

	"github.com/anishathalye/porcupine"
)

// Kind names an operation.
type Kind uint8

// The operations the model knows.
const (
	KindWrite   Kind = iota + 1 // positional write into a data file
	KindAppend                  // O_APPEND write into a data file
	KindRead                    // positional read from a data file
	KindSize                    // stat of a data file: its size
	KindCreate                  // open(O_CREAT|O_EXCL) in a namespace group
	KindMkdir                   // mkdir in a namespace group
	KindRemove                  // MemoryFS delete: unlink or rmdir
	KindRename                  // rename(2) within a namespace group
	KindReadDir                 // list a directory of a namespace group
	KindStat                    // type and permission bits of a name
	KindChmod                   // set the permission bits of a name
)

var kindNames = map[Kind]string{
	KindWrite: "write", KindAppend: "append", KindRead: "read", KindSize: "size",
	KindCreate: "create", KindMkdir: "mkdir", KindRemove: "remove",
	KindRename: "rename", KindReadDir: "readdir", KindStat: "stat", KindChmod: "chmod",
}

func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// IsData reports whether k works on a data file (as opposed to a namespace
// group).
func (k Kind) IsData() bool { return k >= KindWrite && k <= KindSize }

// IsRead reports whether k changes nothing: a failed read can be left out of
// a history, a failed mutation cannot.
func (k Kind) IsRead() bool {
	return k == KindRead || k == KindSize || k == KindReadDir || k == KindStat
}

// Input is one operation as a client invoked it. Key is the data file or
// the namespace group directory; Path and Path2 are relative to the group
// ("" is the group directory itself, for KindReadDir).
type Input struct {
	Kind  Kind   `json:"kind"`
	Key   string `json:"key"`
	Off   int64  `json:"off,omitempty"`
	Len   int    `json:"len,omitempty"`
	Data  string `json:"data,omitempty"`
	Path  string `json:"path,omitempty"`
	Path2 string `json:"path2,omitempty"`
	Perm  uint32 `json:"perm,omitempty"`
}

// Output is what the operation returned. Unknown marks an operation whose
// outcome the client could not learn (timeout, connection lost): the model
// then accepts it as applied or not.
type Output struct {
	Unknown bool          `json:"unknown,omitempty"`
	Err     syscall.Errno `json:"errno,omitempty"`
	N       int64         `json:"n,omitempty"`
	Data    string        `json:"data,omitempty"`
	Names   []string      `json:"names,omitempty"` // readdir: "name" or "name/" for a directory
	Dir     bool          `json:"dir,omitempty"`
	Perm    uint32        `json:"perm,omitempty"`
}

// Top are the names directly inside every namespace group, and Child the
// one name that may exist inside each of them when it is a directory.
var (
	Top   = [3]string{"a", "b", "c"}
	Child = "x"
)

// NSPaths lists every path a namespace group operation may name.
func NSPaths() []string {
	out := make([]string, 0, 2*len(Top))
	for _, t := range Top {
		out = append(out, t)
	}
	for _, t := range Top {
		out = append(out, t+"/"+Child)
	}
	return out
}

// FS is the porcupine model of both kinds of keys.
func FS() porcupine.Model {
	return porcupine.Model{
		Partition: partition,
		Init:      func() interface{} { return nil },
		Step:      step,
		Equal:     func(a, b interface{}) bool { return a == b },
		Hash:      hashState,
		DescribeOperation: func(in, out interface{}) string {
			return Describe(in.(Input), out.(Output))
		},
		DescribeState: describeState,
	}
}

// partition splits a history by key: operations on different keys never
// affect each other.
func partition(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	var keys []string
	for _, op := range history {
		k := op.Input.(Input).Key
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}

// step dispatches on the kind of key. The initial state of every partition
// is nil: an empty data file or an empty group.
func step(state, input, output interface{}) (bool, interface{}) {
	in, out := input.(Input), output.(Output)
	if in.Kind.IsData() {
		s, _ := state.(string)
		return stepData(s, in, out)
	}
	g, _ := state.(nsState)
	return stepNS(g, in, out)
}

func hashState(state interface{}) uint64 {
	h := fnv.New64a()
	switch s := state.(type) {
	case string:
		_, _ = h.Write([]byte(s))
	case nsState:
		for _, v := range s {
			_, _ = h.Write([]byte{byte(v >> 8), byte(v)})
		}
	}
	return h.Sum64()
}

func describeState(state interface{}) string {
	switch s := state.(type) {
	case string:
		return fmt.Sprintf("%d bytes %s", len(s), clip(s, 96))
	case nsState:
		return s.String()
	}
	return "empty"
}

// Describe renders one operation for humans (the visualisation, logs).
func Describe(in Input, out Output) string {
	var b strings.Builder
	b.WriteString(in.Kind.String())
	switch in.Kind {
	case KindWrite:
		fmt.Fprintf(&b, "(%s@%d %q)", in.Key, in.Off, clip(in.Data, 24))
	case KindAppend:
		fmt.Fprintf(&b, "(%s %q)", in.Key, clip(in.Data, 24))
	case KindRead:
		fmt.Fprintf(&b, "(%s@%d+%d)", in.Key, in.Off, in.Len)
	case KindSize:
		fmt.Fprintf(&b, "(%s)", in.Key)
	case KindRename:
		fmt.Fprintf(&b, "(%s %s → %s)", in.Key, in.Path, in.Path2)
	case KindChmod, KindCreate:
		fmt.Fprintf(&b, "(%s/%s %o)", in.Key, in.Path, in.Perm)
	default:
		fmt.Fprintf(&b, "(%s/%s)", in.Key, in.Path)
	}
	b.WriteString(" → ")
	switch {
	case out.Unknown:
		b.WriteString("?")
	case out.Err != 0:
		b.WriteString(errnoName(out.Err))
	case in.Kind == KindRead:
		fmt.Fprintf(&b, "%q", clip(out.Data, 48))
	case in.Kind == KindReadDir:
		fmt.Fprintf(&b, "%v", out.Names)
	case in.Kind == KindStat:
		if out.Dir {
			b.WriteString("dir")
		} else {
			fmt.Fprintf(&b, "file %o", out.Perm)
		}
	case in.Kind == KindSize:
		fmt.Fprintf(&b, "%d", out.N)
	default:
		b.WriteString("ok")
	}
	return b.String()
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func errnoName(e syscall.Errno) string {
	names := map[syscall.Errno]string{
		syscall.ENOENT: "ENOENT", syscall.EEXIST: "EEXIST", syscall.ENOTDIR: "ENOTDIR",
		syscall.EISDIR: "EISDIR", syscall.ENOTEMPTY: "ENOTEMPTY", syscall.EINVAL: "EINVAL",
		syscall.EBUSY: "EBUSY",
	}
	if s, ok := names[e]; ok {
		return s
	}
	return fmt.Sprintf("errno %d", uint32(e))
}
