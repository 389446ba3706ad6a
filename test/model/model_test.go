package model

import (
	"math"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
)

// op builds one operation; ret < 0 means the outcome is unknown.
func op(client int, call, ret int64, in Input, out Output) porcupine.Operation {
	if ret < 0 {
		out.Unknown = true
		ret = math.MaxInt64
	}
	return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: in, Output: out}
}

func wr(key string, off int64, data string) Input {
	return Input{Kind: KindWrite, Key: key, Off: off, Data: data}
}
func ap(key, data string) Input { return Input{Kind: KindAppend, Key: key, Data: data} }
func rd(key string, off int64, n int) Input {
	return Input{Kind: KindRead, Key: key, Off: off, Len: n}
}
func ns(kind Kind, path, path2 string) Input {
	return Input{Kind: kind, Key: "/g0", Path: path, Path2: path2, Perm: 0o644}
}
func size(key string) Input        { return Input{Kind: KindSize, Key: key} }
func n(k int) Output               { return Output{N: int64(k)} }
func data(s string) Output         { return Output{Data: s} }
func errno(e syscall.Errno) Output { return Output{Err: e} }

func TestHistories(t *testing.T) {
	cases := []struct {
		name string
		ok   bool
		ops  []porcupine.Operation
	}{
		{"concurrent writes, reads see one order", true, []porcupine.Operation{
			op(0, 0, 10, wr("/f", 0, "aa"), n(2)),
			op(1, 1, 12, wr("/f", 1, "bb"), n(2)),
			op(2, 13, 14, rd("/f", 0, 10), data("aab")),
			op(0, 15, 16, rd("/f", 0, 10), data("aab")),
		}},
		{"read of a write that completed before is missing it", false, []porcupine.Operation{
			op(0, 0, 10, wr("/f", 0, "aa"), n(2)),
			op(1, 11, 12, rd("/f", 0, 10), data("")),
		}},
		{"stale read after a newer value was read", false, []porcupine.Operation{
			op(0, 0, 10, wr("/f", 0, "1"), n(1)),
			op(0, 11, 20, wr("/f", 0, "2"), n(1)),
			op(1, 12, 30, rd("/f", 0, 1), data("2")),
			op(2, 31, 32, rd("/f", 0, 1), data("1")),
		}},
		{"write past the end leaves zeros", true, []porcupine.Operation{
			op(0, 0, 1, wr("/f", 3, "z"), n(1)),
			op(0, 2, 3, rd("/f", 0, 10), data("\x00\x00\x00z")),
		}},
		{"appends in either order", true, []porcupine.Operation{
			op(0, 0, 10, ap("/f", "<a>"), n(3)),
			op(1, 0, 10, ap("/f", "<b>"), n(3)),
			op(2, 11, 12, rd("/f", 0, 100), data("<b><a>")),
		}},
		{"an append applied twice (lost dedup)", false, []porcupine.Operation{
			op(0, 0, 10, ap("/f", "<a>"), n(3)),
			op(2, 11, 12, rd("/f", 0, 100), data("<a><a>")),
		}},
		{"an unknown append may appear later", true, []porcupine.Operation{
			op(0, 0, -1, ap("/f", "<a>"), Output{}),
			op(1, 5, 6, rd("/f", 0, 100), data("")),
			op(1, 7, 8, rd("/f", 0, 100), data("<a>")),
		}},
		{"an unknown append cannot vanish once seen", false, []porcupine.Operation{
			op(0, 0, -1, ap("/f", "<a>"), Output{}),
			op(1, 5, 6, rd("/f", 0, 100), data("<a>")),
			op(1, 7, 8, rd("/f", 0, 100), data("")),
		}},
		{"size follows appends", true, []porcupine.Operation{
			op(0, 0, 1, ap("/f", "abc"), n(3)),
			op(0, 2, 3, Input{Kind: KindSize, Key: "/f"}, n(3)),
		}},
		{"keys are independent", true, []porcupine.Operation{
			op(0, 0, 1, wr("/f", 0, "a"), n(1)),
			op(0, 2, 3, rd("/g", 0, 1), data("")),
		}},
		{"rename moves the file", true, []porcupine.Operation{
			op(0, 0, 1, ns(KindCreate, "a", ""), Output{}),
			op(0, 2, 3, ns(KindRename, "a", "b"), Output{}),
			op(1, 4, 5, ns(KindStat, "a", ""), errno(syscall.ENOENT)),
			op(1, 6, 7, ns(KindStat, "b", ""), Output{Perm: 0o644}),
			op(1, 8, 9, ns(KindReadDir, "", ""), Output{Names: []string{"b"}}),
		}},
		{"a retried rename reports ENOENT (lost dedup)", false, []porcupine.Operation{
			op(0, 0, 1, ns(KindCreate, "a", ""), Output{}),
			op(0, 2, 3, ns(KindRename, "a", "b"), errno(syscall.ENOENT)),
			op(1, 4, 5, ns(KindStat, "b", ""), Output{Perm: 0o644}),
		}},
		{"a retried create reports EEXIST (lost dedup)", false, []porcupine.Operation{
			op(0, 0, 1, ns(KindCreate, "a", ""), errno(syscall.EEXIST)),
		}},
		{"concurrent creates: exactly one wins", true, []porcupine.Operation{
			op(0, 0, 10, ns(KindMkdir, "a", ""), Output{}),
			op(1, 0, 10, ns(KindMkdir, "a", ""), errno(syscall.EEXIST)),
			op(2, 0, 10, ns(KindCreate, "a", ""), errno(syscall.EEXIST)),
		}},
		{"concurrent creates: two cannot win", false, []porcupine.Operation{
			op(0, 0, 10, ns(KindMkdir, "a", ""), Output{}),
			op(1, 0, 10, ns(KindMkdir, "a", ""), Output{}),
		}},
		{"a directory moves with its child", true, []porcupine.Operation{
			op(0, 0, 1, ns(KindMkdir, "a", ""), Output{}),
			op(0, 2, 3, ns(KindCreate, "a/x", ""), Output{}),
			op(0, 4, 5, ns(KindRemove, "a", ""), errno(syscall.ENOTEMPTY)),
			op(0, 6, 7, ns(KindRename, "a", "c"), Output{}),
			op(0, 8, 9, ns(KindReadDir, "c", ""), Output{Names: []string{"x"}}),
			op(0, 10, 11, ns(KindStat, "a/x", ""), errno(syscall.ENOENT)),
			op(0, 12, 13, ns(KindChmod, "c/x", ""), Output{}),
		}},
		{"rename errors by type", true, []porcupine.Operation{
			op(0, 0, 1, ns(KindMkdir, "a", ""), Output{}),
			op(0, 2, 3, ns(KindCreate, "b", ""), Output{}),
			op(0, 4, 5, ns(KindRename, "a", "b"), errno(syscall.ENOTDIR)),
			op(0, 6, 7, ns(KindRename, "b", "a"), errno(syscall.EISDIR)),
			op(0, 8, 9, ns(KindCreate, "b/x", ""), errno(syscall.ENOTDIR)),
			op(0, 10, 11, ns(KindCreate, "c/x", ""), errno(syscall.ENOENT)),
			op(0, 12, 13, ns(KindRename, "b", "b"), Output{}),
		}},
		{"a removed name does not come back", false, []porcupine.Operation{
			op(0, 0, 1, ns(KindCreate, "a", ""), Output{}),
			op(0, 2, 3, ns(KindRemove, "a", ""), Output{}),
			op(1, 4, 5, ns(KindReadDir, "", ""), Output{Names: []string{"a"}}),
		}},
		{"chmod is seen by stat", false, []porcupine.Operation{
			op(0, 0, 1, ns(KindCreate, "a", ""), Output{}),
			op(0, 2, 3, Input{Kind: KindChmod, Key: "/g0", Path: "a", Perm: 0o600}, Output{}),
			op(1, 4, 5, ns(KindStat, "a", ""), Output{Perm: 0o644}),
		}},
		// What a caching reader (test/workload/caching.go) may and may not
		// answer: the old state while a change waits for its recall, never
		// once the change returned.
		{"a cached size while the append waits for the recall", true, []porcupine.Operation{
			op(1, 0, 1, size("/f"), n(0)),
			op(0, 2, 20, ap("/f", "<a>"), n(3)),
			op(1, 5, 6, size("/f"), n(0)),
			op(1, 18, 19, size("/f"), n(0)),
			op(1, 21, 22, size("/f"), n(3)),
		}},
		{"a cached size after the append returned", false, []porcupine.Operation{
			op(1, 0, 1, size("/f"), n(0)),
			op(0, 2, 20, ap("/f", "<a>"), n(3)),
			op(1, 21, 22, size("/f"), n(0)),
		}},
		{"a cached size newer than a later read", false, []porcupine.Operation{
			op(0, 0, 20, ap("/f", "<a>"), n(3)),
			op(1, 5, 6, size("/f"), n(3)),
			op(2, 7, 8, rd("/f", 0, 10), data("")),
		}},
		{"a data file never reports ENOENT", false, []porcupine.Operation{
			op(1, 0, 1, size("/f"), errno(syscall.ENOENT)),
		}},
		{"a cached missing name while the create waits for the recall", true, []porcupine.Operation{
			op(0, 0, 20, ns(KindCreate, "a", ""), Output{}),
			op(1, 5, 6, ns(KindStat, "a", ""), errno(syscall.ENOENT)),
			op(1, 21, 22, ns(KindStat, "a", ""), Output{Perm: 0o644}),
		}},
		{"a cached missing name after the create returned", false, []porcupine.Operation{
			op(1, 0, 1, ns(KindReadDir, "", ""), Output{}),
			op(0, 2, 20, ns(KindCreate, "a", ""), Output{}),
			op(1, 21, 22, ns(KindStat, "a", ""), errno(syscall.ENOENT)),
		}},
		{"a cached listing without a directory made before", false, []porcupine.Operation{
			op(0, 0, 1, ns(KindCreate, "a", ""), Output{}),
			op(1, 2, 3, ns(KindReadDir, "", ""), Output{Names: []string{"a"}}),
			op(0, 4, 5, Input{Kind: KindMkdir, Key: "/g0", Path: "c", Perm: 0o755}, Output{}),
			op(1, 6, 7, ns(KindReadDir, "", ""), Output{Names: []string{"a"}}),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.ok, porcupine.CheckOperations(FS(), tc.ops))
		})
	}
}

func TestWriteAt(t *testing.T) {
	require.Equal(t, "abXd", writeAt("abcd", 2, "X"))
	require.Equal(t, "abXY", writeAt("abc", 2, "XY"))
	require.Equal(t, "a\x00X", writeAt("a", 2, "X"))
	require.Equal(t, "", readAt("abc", 3, 5))
	require.Equal(t, "bc", readAt("abc", 1, 5))
}

// TestSaveWritesVisualisation checks the files a violation leaves behind.
func TestSaveWritesVisualisation(t *testing.T) {
	t.Setenv("MEMFS_TEST_OUT", t.TempDir())
	ops := []porcupine.Operation{
		op(0, 0, 10, ap("/f", "<a>"), n(3)),
		op(2, 11, 12, rd("/f", 0, 100), data("<a><a>")),
	}
	res, info := porcupine.CheckOperationsVerbose(FS(), ops, 0)
	require.Equal(t, porcupine.Illegal, res)
	dir, err := Save(t.Name(), 7, ops, info)
	require.NoError(t, err)
	for _, f := range []string{"history.json", "visualization.html"} {
		st, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err)
		require.NotZero(t, st.Size())
	}
	back, err := LoadHistory(filepath.Join(dir, "history.json"))
	require.NoError(t, err)
	require.Equal(t, ops, back)
	require.False(t, porcupine.CheckOperations(FS(), back))
}

// TestExplainSavedHistory explains a history saved by a failing run:
// MEMFS_HISTORY=/path/to/history.json go test -run TestExplainSavedHistory -v ./test/model/
func TestExplainSavedHistory(t *testing.T) {
	p := os.Getenv("MEMFS_HISTORY")
	if p == "" {
		t.Skip("MEMFS_HISTORY not set")
	}
	ops, err := LoadHistory(p)
	require.NoError(t, err)
	t.Logf("%d operations\n%s", len(ops), Explain(ops))
}

func TestExplain(t *testing.T) {
	ops := []porcupine.Operation{
		op(0, 0, 10, ap("/f", "<a>"), n(3)),
		op(2, 11, 12, rd("/f", 0, 100), data("<a><a>")),
		op(2, 13, 14, rd("/g", 0, 100), data("")),
	}
	s := Explain(ops)
	require.Contains(t, s, "key /f")
	require.NotContains(t, s, "key /g")
	require.Contains(t, s, `cannot follow: read(/f@0+100)`)
	require.Empty(t, Explain(ops[2:]))
}

// TestRecordedViolation checks the model against a history recorded by a
// soak run (docs/testing.md, "Bugs the suite found"): a test cluster's
// client reached another cluster's node, and an append token showed up
// twice in /h8/d/f2. The model must reject it, and Explain must point at
// that key.
func TestRecordedViolation(t *testing.T) {
	ops, err := LoadHistory(filepath.Join("testdata", "double-append.json"))
	require.NoError(t, err)
	require.Len(t, ops, 178)
	require.False(t, porcupine.CheckOperations(FS(), ops))
	s := Explain(ops)
	require.Contains(t, s, "key /h8/d/f2")
	require.NotContains(t, s, "key /h8/d/f0")
}

// TestHeld: a held answer enters the history only when settled: confirmed,
// as it returned; voided, a change as of unknown outcome and a read not
// at all.
func TestHeld(t *testing.T) {
	r := NewRecorder()
	mk := r.Begin(0, ns(KindMkdir, "a", ""))
	ls := r.Begin(0, Input{Kind: KindReadDir, Key: "/g0"})
	ok := r.Begin(1, ns(KindCreate, "b", ""))
	hm, hl, ho := mk.Hold(Output{}), ls.Hold(Output{Names: []string{"a/"}}), ok.Hold(Output{})
	require.Empty(t, r.Operations())
	require.Equal(t, mk.Invoked(), hm.Invoked())
	ho.Confirm()
	hm.Void()
	hl.Void()
	ops := r.Operations()
	require.Len(t, ops, 2)
	require.Equal(t, Output{}, ops[0].Output)
	require.Less(t, ops[0].Return, int64(math.MaxInt64))
	require.GreaterOrEqual(t, ops[0].Return, ops[0].Call)
	require.Equal(t, Output{Unknown: true}, ops[1].Output)
	require.Equal(t, int64(math.MaxInt64), ops[1].Return)
	require.Equal(t, KindMkdir, ops[1].Input.(Input).Kind)
}
