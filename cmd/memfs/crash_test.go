package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/server/servertest"
)

// TestBufferedMountCrashLeavesPrefix kills a buffering mount (kill -9) in
// the middle of a `tar -x`, at a different moment each round, and checks
// that the cluster holds exactly what a prefix of tar's operations made:
// tar makes the archive's members in order, so the members present must
// be the first k, each complete but the last (a file's data may be cut
// where a batch ended), with nothing after them.
func TestBufferedMountCrashLeavesPrefix(t *testing.T) {
	requireFUSE(t)
	bin := memfsBinary(t)
	cl := servertest.StartCluster(t, 3)
	cluster := strings.Join(cl.APIAddrs(), ",")
	archive, members, contents := crashArchive(t)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := client.New(ctx, cl.APIAddrs())
	require.NoError(t, err)
	defer c.Close()

	rng := rand.New(rand.NewPCG(7, 11))
	for round := range 3 {
		dir := t.TempDir()
		lazyUnmountAtCleanup(t, dir)
		out, stderr, code := memfsCmd(t, bin, cluster, "mount", "--daemon", "--lease", "2s", dir)
		require.Zero(t, code, stderr)
		pid := daemonPID(t, out)
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		sub := fmt.Sprintf("r%d", round)
		require.NoError(t, os.Mkdir(filepath.Join(dir, sub), 0o755))

		tar := exec.Command("tar", "-xf", archive, "-C", filepath.Join(dir, sub))
		var tarErr bytes.Buffer
		tar.Stderr = &tarErr
		require.NoError(t, tar.Start())
		time.Sleep(time.Duration(100+rng.IntN(600)) * time.Millisecond) // the moment of the crash, not a wait for a condition
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		_ = tar.Wait()
		waitFor(t, 10*time.Second, "mount dies", func() bool { return processGone(pid) })

		present := 0
		for i, m := range members {
			p := "/" + sub + "/" + strings.TrimSuffix(m, "/")
			fi, err := c.Lstat(p)
			if err != nil {
				require.ErrorIs(t, err, fs.ErrNotExist, p)
				for _, later := range members[i+1:] {
					_, err := c.Lstat("/" + sub + "/" + strings.TrimSuffix(later, "/"))
					require.ErrorIs(t, err, fs.ErrNotExist, "%s exists after %s, which does not (round %d)", later, m, round)
				}
				break
			}
			present++
			want, isFile := contents[m]
			if !isFile {
				require.True(t, fi.IsDir(), p)
				continue
			}
			got, err := c.ReadFile(p)
			require.NoError(t, err)
			last := i == len(members)-1
			if !last {
				if _, err := c.Lstat("/" + sub + "/" + strings.TrimSuffix(members[i+1], "/")); err == nil {
					require.Equal(t, want, got, "%s is complete: a later member exists", p)
					continue
				}
			}
			require.True(t, bytes.HasPrefix(want, got), "%s holds %d bytes that are not a prefix of its content", p, len(got))
		}
		t.Logf("round %d: %d of %d members present after the crash (tar: %s)", round, present, len(members), strings.TrimSpace(firstLine(tarErr.String())))
	}
}

// TestBufferedMountCrashKeepsGitConsistent kills a buffering mount (kill
// -9) in the middle of `git add` and `git commit` of a repository on it,
// at a different moment each round, and mounts again: the cluster holds a
// prefix of what git did, and git writes objects before the refs that name
// them, so `git fsck` passes and HEAD is the old commit or the new one.
// A commit that returned, with its ref's directory synced, is there: fsync
// of a file or directory commits the journal.
func TestBufferedMountCrashKeepsGitConsistent(t *testing.T) {
	requireFUSE(t)
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	bin := memfsBinary(t)
	cl := servertest.StartCluster(t, 3)
	cluster := strings.Join(cl.APIAddrs(), ",")
	src := t.TempDir()
	for i := range 40 {
		require.NoError(t, os.WriteFile(filepath.Join(src, fmt.Sprintf("f%02d.txt", i)), bytes.Repeat([]byte(fmt.Sprintf("line %d\n", i)), 200), 0o644))
	}
	mount := func() (string, int) {
		dir := t.TempDir()
		lazyUnmountAtCleanup(t, dir)
		out, stderr, code := memfsCmd(t, bin, cluster, "mount", "--daemon", "--lease", "2s", dir)
		require.Zero(t, code, stderr)
		pid := daemonPID(t, out)
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		return dir, pid
	}
	git := func(dir string, args ...string) (string, error) {
		cmd := exec.Command("git", append([]string{"-c", "core.fsync=all", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "safe.directory=*"}, args...)...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	rng := rand.New(rand.NewPCG(3, 5))
	for round := range 4 {
		dir, pid := mount()
		repo := filepath.Join(dir, fmt.Sprintf("repo%d", round))
		require.NoError(t, os.Mkdir(repo, 0o755))
		out, err := git(repo, "init", "-q")
		require.NoError(t, err, out)
		require.NoError(t, os.WriteFile(filepath.Join(repo, "base"), []byte("base\n"), 0o644))
		out, err = git(repo, "add", "base")
		require.NoError(t, err, out)
		out, err = git(repo, "commit", "-q", "-m", "base")
		require.NoError(t, err, out)
		base, err := git(repo, "rev-parse", "HEAD")
		require.NoError(t, err, base)

		// The second commit, killed somewhere in it.
		script := exec.Command("sh", "-c", "cp "+src+"/* . && git -c core.fsync=all -c user.name=t -c user.email=t@t -c safe.directory='*' add -A && git -c core.fsync=all -c user.name=t -c user.email=t@t -c safe.directory='*' commit -q -m second")
		script.Dir = repo
		require.NoError(t, script.Start())
		var returned bool
		if round < 3 {
			time.Sleep(time.Duration(20+rng.IntN(1200)) * time.Millisecond) // the moment of the crash, not a wait for a condition
			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
			returned = script.Wait() == nil
		} else {
			// The last round kills the mount right after the commit
			// returned and its directory was synced: git fsyncs files
			// (core.fsync=all) but not the directory whose rename
			// publishes the new ref, so without it the rename may be lost
			// here as on a local file system.
			returned = script.Wait() == nil
			require.True(t, returned, "the commit without a crash")
			d, err := os.Open(filepath.Join(repo, ".git", "refs", "heads"))
			require.NoError(t, err)
			require.NoError(t, d.Sync())
			require.NoError(t, d.Close())
			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		}
		waitFor(t, 10*time.Second, "mount dies", func() bool { return processGone(pid) })

		again, _ := mount()
		repo = filepath.Join(again, fmt.Sprintf("repo%d", round))
		out, err = git(repo, "fsck", "--full")
		require.NoError(t, err, "git fsck after the crash (round %d): %s", round, out)
		head, err := git(repo, "rev-parse", "HEAD")
		require.NoError(t, err, head)
		msg, err := git(repo, "log", "-1", "--format=%s")
		require.NoError(t, err, msg)
		switch {
		case round == 3:
			require.Equal(t, "second\n", msg, "a commit that returned, its ref's directory synced, is kept")
		case head == base:
		default:
			require.Equal(t, "second\n", msg, "HEAD is the old commit or the new one (round %d)", round)
		}
		t.Logf("round %d: commit returned before the kill: %v; HEAD after: %s", round, returned, strings.TrimSpace(msg))
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// crashArchive writes a tar archive of a tree of directories and files
// (some larger than what the journal carries for a file) and returns it
// with its members in archive order and each file's content.
func crashArchive(t *testing.T) (string, []string, map[string][]byte) {
	t.Helper()
	src := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	for d := range 12 {
		dir := filepath.Join(src, fmt.Sprintf("d%02d", d))
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
		for f := range 30 {
			size := 1 + rng.IntN(6000)
			if f == 7 {
				size = 300 << 10
			}
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			name := filepath.Join(dir, fmt.Sprintf("f%02d", f))
			if f%3 == 0 {
				name = filepath.Join(dir, "sub", fmt.Sprintf("f%02d", f))
			}
			require.NoError(t, os.WriteFile(name, data, 0o644))
		}
	}
	archive := filepath.Join(t.TempDir(), "tree.tar")
	out, err := exec.Command("tar", "-cf", archive, "-C", src, ".").CombinedOutput()
	require.NoError(t, err, string(out))
	list, err := exec.Command("tar", "-tf", archive).Output()
	require.NoError(t, err)
	var members []string
	contents := map[string][]byte{}
	for _, m := range strings.Split(strings.TrimSpace(string(list)), "\n") {
		m = strings.TrimPrefix(m, "./")
		if m == "" || m == "." {
			continue
		}
		members = append(members, m)
		if !strings.HasSuffix(m, "/") {
			data, err := os.ReadFile(filepath.Join(src, m))
			require.NoError(t, err)
			contents[m] = data
		}
	}
	return archive, members, contents
}
