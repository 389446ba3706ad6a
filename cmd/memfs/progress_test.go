package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
)

// tmuxSession runs shell commands in a detached tmux session on its own
// server socket (a real terminal for the program), killed at cleanup.
type tmuxSession struct {
	t      *testing.T
	socket string
}

func newTmux(t *testing.T) *tmuxSession {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux is not installed (apt-get install -y tmux): terminal output is tested in it")
	}
	s := &tmuxSession{t: t, socket: fmt.Sprintf("memfs-test-%d-%d", os.Getpid(), time.Now().UnixNano())}
	t.Cleanup(func() { _ = exec.Command("tmux", "-L", s.socket, "kill-server").Run() })
	return s
}

// run starts cmd (a shell command line) in a new window of width x height.
func (s *tmuxSession) run(name, cmd string, width, height int) {
	s.t.Helper()
	out, err := exec.Command("tmux", "-L", s.socket, "new-session", "-d", "-s", name,
		"-x", fmt.Sprint(width), "-y", fmt.Sprint(height), cmd).CombinedOutput()
	require.NoError(s.t, err, "%s", out)
}

// screen is what the session's window shows now.
func (s *tmuxSession) screen(name string) string {
	s.t.Helper()
	out, err := exec.Command("tmux", "-L", s.socket, "capture-pane", "-p", "-t", name).Output()
	require.NoError(s.t, err)
	return string(out)
}

// waitScreen polls the window until it shows want.
func (s *tmuxSession) waitScreen(name, want string, d time.Duration) string {
	s.t.Helper()
	var last string
	require.Eventually(s.t, func() bool {
		last = s.screen(name)
		return strings.Contains(last, want)
	}, d, 100*time.Millisecond, "window %s never showed %q; it shows:\n%s", name, want, &last)
	return last
}

func TestProgressBarsOnlyOnATerminal(t *testing.T) {
	tm := newTmux(t)
	m := upCLI(t)
	bin := m.bin
	local := filepath.Join(t.TempDir(), "big")
	require.NoError(t, os.WriteFile(local, randomData(24<<20, 5), 0o644))

	// Into a pipe (a script): no bar, nothing on stderr.
	_, errOut, code := m.run("", "put", local, "/piped")
	require.Zero(t, code, errOut)
	require.Empty(t, errOut)
	_, errOut, code = m.run("", "get", "/piped", filepath.Join(t.TempDir(), "back"))
	require.Zero(t, code, errOut)
	require.Empty(t, errOut)

	// On a terminal: a bar with the size, ending complete.
	base := fmt.Sprintf("%s --cluster %s --timeout 60s", bin, m.cluster)
	back := filepath.Join(t.TempDir(), "back")
	tm.run("put", fmt.Sprintf("%s put %s /t && %s get /t %s; echo status=$?; sleep 600", base, local, base, back), 150, 12)
	screen := tm.waitScreen("put", "status=", 2*time.Minute)
	require.Contains(t, screen, "status=0")
	require.Contains(t, screen, "put /t")
	require.Contains(t, screen, "get /t")
	require.Contains(t, screen, "100%")
	require.Contains(t, screen, "24 MiB")
	got, err := os.ReadFile(back)
	require.NoError(t, err)
	require.Len(t, got, 24<<20)

	// rm -r counts the entries, then removes them with a bar to that count.
	cl, err := client.New(context.Background(), strings.Split(m.cluster, ","))
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.MkdirAll("/tree/sub", 0o755))
	for i := range 50 {
		require.NoError(t, cl.WriteFile(fmt.Sprintf("/tree/sub/f%d", i), []byte("x"), 0o644))
	}
	// clone -r is one command: a spinner while it runs, erased at the end.
	tm.run("clone", fmt.Sprintf("%s clone -r /tree /copy; echo status=$?; sleep 600", base), 150, 12)
	screen = tm.waitScreen("clone", "status=", 2*time.Minute)
	require.Equal(t, "status=0", strings.TrimSpace(screen))
	require.Len(t, strings.Fields(m.ok("ls", "/copy/sub")), 50)

	tm.run("rm", fmt.Sprintf("%s rm -r /tree; echo status=$?; sleep 600", base), 150, 12)
	screen = tm.waitScreen("rm", "status=", 2*time.Minute)
	require.Contains(t, screen, "status=0")
	require.Regexp(t, `rm -r /tree 100% .*\(52/52, [0-9]+ entries/(s|min|hr)\) \[[0-9hms]+\]`, screen,
		"50 files and 2 directories counted first, the rate and, at the end, the time taken")
	_, errOut, code = m.run("", "ls", "/tree")
	require.Equal(t, 1, code, errOut)

	// --quiet: nothing on the terminal either.
	tm.run("quiet", fmt.Sprintf("%s --quiet put %s /q; echo status=$?; sleep 600", base, local), 150, 12)
	screen = tm.waitScreen("quiet", "status=", 2*time.Minute)
	require.Equal(t, "status=0", strings.TrimSpace(screen))
}
