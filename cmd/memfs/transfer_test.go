package main

import (
	"bytes"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/server/servertest"
)

// pacedStream writes pieces of data with a pause before each, so that a
// copy from it lasts at least pieces x pause whatever the machine's speed.
type pacedStream struct {
	data  []byte
	piece int
	pause time.Duration
}

// Read serves callers other than exec's copy: one piece at most, paced.
func (r *pacedStream) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	time.Sleep(r.pause)
	n := copy(p[:min(len(p), r.piece)], r.data)
	r.data = r.data[n:]
	return n, nil
}

// WriteTo is what exec's stdin copy calls: it writes whole pieces.
func (r *pacedStream) WriteTo(w io.Writer) (int64, error) {
	var n int64
	for len(r.data) > 0 {
		time.Sleep(r.pause) // the pacing is what the test is about
		k, err := w.Write(r.data[:min(len(r.data), r.piece)])
		n += int64(k)
		r.data = r.data[k:]
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// noTemps requires that no copy's temporary file is left in the listing.
func noTemps(t *testing.T, listing string) {
	t.Helper()
	require.NotContains(t, listing, ".memfs-", "a temporary file was left behind")
}

func TestPutOutlastsTimeout(t *testing.T) {
	m := upCLI(t)
	bin := m.bin
	data := make([]byte, 24<<20)
	rand.NewChaCha8([32]byte{3}).Read(data)

	// The stream takes at least 48 x 200 ms = 9.6 s to arrive, twice the
	// --timeout: each piece is answered well within it, so put succeeds.
	cmd := exec.Command(bin, "--cluster", m.cluster, "--timeout", "5s", "put", "-", "/big")
	cmd.Stdin = &pacedStream{data: data, piece: 512 << 10, pause: 200 * time.Millisecond}
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	require.NoError(t, cmd.Run(), errOut.String())
	local := filepath.Join(t.TempDir(), "big")
	m.ok("get", "/big", local)
	back, err := os.ReadFile(local)
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, back), "the file reads back as sent")
	require.Equal(t, "big\n", m.ok("ls", "/"))
	entries, err := os.ReadDir(filepath.Dir(local))
	require.NoError(t, err)
	require.Len(t, entries, 1, "get left only its target")
}

func TestInterruptedPutLeavesTargetAsItWas(t *testing.T) {
	bin := memfsBinary(t)
	cluster := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	m := cli{t: t, bin: bin, cluster: strings.Join(cluster.APIAddrs(), ",")}
	_, errOut, code := m.run("old content", "put", "-", "/t")
	require.Zero(t, code, errOut)

	// A stream that never ends: put is interrupted in the middle.
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	cmd := exec.Command(bin, "--cluster", m.cluster, "put", "-", "/t")
	cmd.Stdin = pr
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	go func() {
		piece := bytes.Repeat([]byte("new"), 100<<10)
		for {
			if _, err := pw.Write(piece); err != nil {
				return
			}
		}
	}()
	require.Eventually(t, func() bool { return strings.Contains(m.ok("ls", "/"), ".t.memfs-put-") },
		60*time.Second, 50*time.Millisecond, "put writes to a temporary name")
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	err := cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, stderr.String())
	require.Equal(t, 1, ee.ExitCode())
	require.Contains(t, stderr.String(), "interrupted; the target was left as it was")
	require.Equal(t, "old content", m.ok("cat", "/t"))
	listing := m.ok("ls", "/")
	require.Equal(t, "t\n", listing)
}

func TestFailedTransfersLeaveNothing(t *testing.T) {
	bin := memfsBinary(t)
	cluster := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	m := cli{t: t, bin: bin, cluster: strings.Join(cluster.APIAddrs(), ",")}
	m.ok("mkdir", "/dir")
	_, errOut, code := m.run("remote", "put", "-", "/file")
	require.Zero(t, code, errOut)
	dir := t.TempDir()
	kept := filepath.Join(dir, "kept")
	require.NoError(t, os.WriteFile(kept, []byte("local"), 0o600))

	cases := []struct {
		name string
		args []string
		msg  string
	}{
		{"get of a missing file", []string{"get", "/nope", filepath.Join(dir, "new")}, "open /nope: no such file or directory"},
		{"get of a directory", []string{"get", "/dir", filepath.Join(dir, "new")}, "is a directory"},
		{"get over a file, failing", []string{"get", "/nope", kept}, "no such file or directory"},
		{"put into a missing directory", []string{"put", kept, "/no/such/f"}, "open /no/such/f: no such file or directory"},
		{"put over a directory", []string{"put", "-", "/dir"}, "put /dir: is a directory"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, code := m.run("data", tc.args...)
			require.Equal(t, 1, code)
			require.Contains(t, errOut, tc.msg)
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one readable line: %q", errOut)
		})
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "only the file that was there")
	b, err := os.ReadFile(kept)
	require.NoError(t, err)
	require.Equal(t, "local", string(b))
	listing := m.ok("ls", "/")
	noTemps(t, listing)
	require.Equal(t, "dir\nfile\n", listing)

	// A successful copy over an existing file keeps the file's mode.
	m.ok("get", "/file", kept)
	b, err = os.ReadFile(kept)
	require.NoError(t, err)
	require.Equal(t, "remote", string(b))
	fi, err := os.Stat(kept)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
}

// recordingFile is an io.WriterAt that keeps what it is given and counts
// the writes in progress at once.
type recordingFile struct {
	mu       sync.Mutex
	data     []byte
	now, top int
	pause    time.Duration
	failAt   int64 // offset whose write fails; -1 for none
}

func (f *recordingFile) WriteAt(p []byte, off int64) (int, error) {
	f.mu.Lock()
	f.now++
	f.top = max(f.top, f.now)
	f.mu.Unlock()
	time.Sleep(f.pause)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now--
	if off == f.failAt {
		return 0, syscall.ENOSPC
	}
	if end := int(off) + len(p); end > len(f.data) {
		f.data = append(f.data, make([]byte, end-len(f.data))...)
	}
	copy(f.data[off:], p)
	return len(p), nil
}

func TestWritePiecesKeepsAWindowInFlight(t *testing.T) {
	for _, size := range []int{0, 5, 1000, 4096, 10*1000 + 7} {
		data := make([]byte, size)
		rand.NewChaCha8([32]byte{byte(size)}).Read(data)
		f := &recordingFile{pause: 5 * time.Millisecond, failAt: -1}
		// A reader that returns little at a time: pieces are still whole.
		require.NoError(t, writePieces(f, iotest.HalfReader(bytes.NewReader(data)), 1000, 3, nil))
		require.Equal(t, data, append([]byte{}, f.data...), "size %d", size)
		if size > 3000 {
			require.Equal(t, 3, f.top, "size %d: writes in flight", size)
		}
	}
}

func TestWritePiecesStopsAtTheFirstError(t *testing.T) {
	f := &recordingFile{failAt: 2000}
	read := &countingReader{r: bytes.NewReader(make([]byte, 100_000))}
	err := writePieces(f, read, 1000, 2, nil)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.Less(t, read.n, int64(10_000), "reading goes on after a failed write")

	broken := io.MultiReader(bytes.NewReader(make([]byte, 2500)), iotest.ErrReader(syscall.EIO))
	require.ErrorIs(t, writePieces(&recordingFile{failAt: -1}, broken, 1000, 2, nil), syscall.EIO)
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
