package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/server/servertest"
)

// cli runs the memfs binary against one cluster.
type cli struct {
	t       *testing.T
	bin     string
	cluster string
}

// run runs memfs with args and stdin and returns stdout, stderr and the
// exit code.
func (c cli) run(stdin string, args ...string) (string, string, int) {
	c.t.Helper()
	cmd := exec.Command(c.bin, append([]string{"--cluster", c.cluster, "--timeout", "60s"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(c.t, err)
	}
	return out.String(), errOut.String(), code
}

// ok runs memfs and requires success; it returns stdout.
func (c cli) ok(args ...string) string {
	c.t.Helper()
	out, errOut, code := c.run("", args...)
	require.Zero(c.t, code, "memfs %v: %s", args, errOut)
	return out
}

func TestFileCommandsEndToEnd(t *testing.T) {
	bin := memfsBinary(t)
	cluster := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	m := cli{t: t, bin: bin, cluster: strings.Join(cluster.APIAddrs(), ",")}
	dir := t.TempDir()

	// put/cat/get of a file of several pieces, larger than one message.
	content := make([]byte, 2*copyBuf+3<<20+123)
	rand.NewChaCha8([32]byte{7}).Read(content)
	local := filepath.Join(dir, "local.bin")
	require.NoError(t, os.WriteFile(local, content, 0o644))
	m.ok("mkdir", "-p", "/a/b")
	m.ok("put", local, "/a/b/f")
	require.Equal(t, string(content), m.ok("cat", "/a/b/f"))
	m.ok("get", "/a/b/f", filepath.Join(dir, "back.bin"))
	back, err := os.ReadFile(filepath.Join(dir, "back.bin"))
	require.NoError(t, err)
	require.Equal(t, content, back)
	require.Equal(t, string(content), m.ok("get", "/a/b/f", "-"))

	// put from standard input, ls, stat.
	_, errOut, code := m.run("hello", "put", "-", "/a/stdin.txt")
	require.Zero(t, code, errOut)
	require.Equal(t, "hello", m.ok("cat", "/a/stdin.txt"))
	require.Equal(t, "b\nstdin.txt\n", m.ok("ls", "/a"))
	long := m.ok("ls", "-l", "/a")
	require.Regexp(t, `(?m)^-rw-r--r-- +1 +\d+ +\d+ +5 .* stdin\.txt$`, long)
	require.Regexp(t, `(?m)^d.* b$`, long)
	require.Contains(t, m.ok("stat", "/a/stdin.txt"), "Size: 5 ")

	// mv into a directory, links.
	m.ok("mv", "/a/stdin.txt", "/a/b")
	require.Equal(t, "hello", m.ok("cat", "/a/b/stdin.txt"))
	m.ok("ln", "-s", "/a/b/stdin.txt", "/a/link")
	require.Contains(t, m.ok("ls", "-l", "/a"), "link -> /a/b/stdin.txt")
	require.Equal(t, "hello", m.ok("cat", "/a/link"))
	m.ok("ln", "/a/b/stdin.txt", "/a/hard")
	require.Contains(t, m.ok("stat", "/a/hard"), "Links: 2")

	// rm, rm -r.
	m.ok("rm", "/a/hard")
	_, errOut, code = m.run("", "rm", "/a")
	require.Equal(t, 1, code)
	require.Equal(t, "memfs: remove /a: directory not empty\n", errOut)
	m.ok("rm", "-r", "/a")
	require.NotContains(t, m.ok("ls", "/"), "a\n")

	// Errors: readable, exit 1; usage mistakes exit 2.
	_, errOut, code = m.run("", "stat", "/nope")
	require.Equal(t, 1, code)
	require.Equal(t, "memfs: stat /nope: no such file or directory\n", errOut)
	_, errOut, code = m.run("", "cat", "/nope", "/also")
	require.Equal(t, 1, code)
	require.Equal(t, "memfs: open /nope: no such file or directory\n", errOut)
	_, _, code = m.run("", "cat")
	require.Equal(t, 2, code)
	_, _, code = m.run("", "ls", "--bogus")
	require.Equal(t, 2, code)
}

func TestBenchCommand(t *testing.T) {
	bin := memfsBinary(t)
	cluster := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	m := cli{t: t, bin: bin, cluster: strings.Join(cluster.APIAddrs(), ",")}
	out := m.ok("bench", "--json", "--total", "4MiB", "--size", "1MiB", "--concurrency", "2",
		"--creates", "40", "--clients", "4")
	var rep benchReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Len(t, rep.Phases, 3)
	for i, name := range []string{"write", "read", "create"} {
		p := rep.Phases[i]
		require.Equal(t, name, p.Phase)
		require.Positive(t, p.MBPerSec)
		require.Positive(t, p.P50Ms)
		require.LessOrEqual(t, p.P50Ms, p.P99Ms)
	}
	require.Equal(t, 4, rep.Phases[0].Ops)
	require.Equal(t, 40, rep.Phases[2].Ops)
	// The benchmark cleans up after itself.
	require.Equal(t, "", m.ok("ls", "/"))

	table := m.ok("bench", "--total", "2MiB", "--creates", "10", "--clients", "2")
	require.Contains(t, table, "files/s")
	require.Contains(t, table, "MB/s")
	_, _, code := m.run("", "bench", "--size", "0")
	require.Equal(t, 2, code)
}

func TestCloneAndDu(t *testing.T) {
	bin := memfsBinary(t)
	cluster := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	m := cli{t: t, bin: bin, cluster: strings.Join(cluster.APIAddrs(), ",")}
	content := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{9}).Read(content)
	local := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(local, content, 0o644))
	m.ok("mkdir", "-p", "/src/sub")
	m.ok("put", local, "/src/sub/f")

	_, errOut, code := m.run("", "clone", "/src", "/dst")
	require.Equal(t, 2, code, "a directory needs -r")
	require.Contains(t, errOut, "is a directory")
	m.ok("clone", "-r", "/src", "/dst")
	m.ok("clone", "/src/sub/f", "/copy")
	require.Equal(t, string(content), m.ok("cat", "/dst/sub/f"))
	require.Equal(t, string(content), m.ok("cat", "/copy"))

	var du duReport
	require.NoError(t, json.Unmarshal([]byte(m.ok("du", "--json", "/")), &du))
	require.Equal(t, uint64(3), du.Files)
	require.Equal(t, uint64(3<<20), du.LogicalBytes)
	require.Equal(t, uint64(1<<20), du.PhysicalBytes, "three copies share one set of blocks")
	require.InDelta(t, 3.0, du.DedupRatio, 0.001)
	require.Contains(t, m.ok("du", "/dst"), "/dst")

	_, errOut, code = m.run("", "clone", "/nope", "/x")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "no such file or directory")
}

func TestLsMode(t *testing.T) {
	for _, tc := range []struct {
		mode fs.FileMode
		want string
	}{
		{0o644, "-rw-r--r--"},
		{fs.ModeDir | 0o755 | fs.ModeSetgid, "drwxr-sr-x"},
		{fs.ModeDir | 0o777 | fs.ModeSticky, "drwxrwxrwt"},
		{fs.ModeSymlink | 0o777, "lrwxrwxrwx"},
		{fs.ModeNamedPipe | 0o640, "prw-r-----"},
		{fs.ModeSocket | 0o755, "srwxr-xr-x"},
		{fs.ModeDevice | fs.ModeCharDevice | 0o666, "crw-rw-rw-"},
		{fs.ModeDevice | 0o660, "brw-rw----"},
		{0o4644 | fs.ModeSetuid, "-rwSr--r--"},
		{fs.ModeSetuid | fs.ModeSetgid | 0o755, "-rwsr-sr-x"},
		{fs.ModeDir | 0o666 | fs.ModeSticky, "drw-rw-rwT"},
	} {
		require.Equal(t, tc.want, lsMode(tc.mode), "%v", tc.mode)
	}
}
