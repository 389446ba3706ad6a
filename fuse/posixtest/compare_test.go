package posixtest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSuiteIsDeterministic runs every case twice on tmpfs: a case whose
// transcript depends on anything but the file system's behaviour (fd
// numbers, times, map order) would make every mount comparison fail.
func TestSuiteIsDeterministic(t *testing.T) {
	Compare(t, RefDir(t), RefDir(t), time.Minute)
}

func TestDiff(t *testing.T) {
	require.Empty(t, Diff([]string{"a", "b"}, []string{"a", "b"}))
	require.Equal(t, "   2 - b\n     + c\n   3 - \n     + d\n", Diff([]string{"a", "b"}, []string{"a", "c", "d"}))
}

// TestRecordsErrnos checks that a failing call is recorded by its errno
// name, which is what makes the two sides comparable.
func TestRecordsErrnos(t *testing.T) {
	r := NewRec(t.TempDir())
	r.Stat("missing")
	r.Mkdir("d", 0o755)
	r.Mkdir("d", 0o755)
	r.Rmdir("d")
	require.Equal(t, []string{"stat missing: ENOENT", "mkdir d 0755: ok", "mkdir d 0755: EEXIST", "rmdir d: ok"}, r.Lines())
}
