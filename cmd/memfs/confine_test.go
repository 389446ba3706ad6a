package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/server/servertest"
)

// TestConfinedTokenCommands: `memfs token create --path` makes a token
// whose holder's file commands see the directory as /, and whatever it
// names outside fails with a clear message and a non-zero exit.
func TestConfinedTokenCommands(t *testing.T) {
	bin := memfsBinary(t)
	c := servertest.StartCluster(t, 3, servertest.WithTLS())
	files := c.CertFiles("admin")
	addrs := strings.Join(c.APIAddrs(), ",")
	admin := cli{t: t, bin: bin, cluster: addrs}
	sec := []string{"--ca", files.CA, "--cert", files.Cert, "--key", files.Key}
	admin.ok(append(sec, "mkdir", "-p", "/tenants/a/docs", "/tenants/b")...)
	local := filepath.Join(t.TempDir(), "f.txt")
	require.NoError(t, os.WriteFile(local, []byte("tenant b's"), 0o644))
	admin.ok(append(sec, "put", local, "/tenants/b/secret")...)

	tok := filepath.Join(t.TempDir(), "a.token")
	out := admin.ok(append(sec, "token", "create", "--role", "write", "--path", "/tenants/a", "--out", tok)...)
	require.Contains(t, out, "written to "+tok)
	require.Contains(t, admin.ok(append(sec, "token", "list")...), "/tenants/a")
	_, errOut, code := admin.run("", append(sec, "token", "create", "--role", "admin", "--path", "/tenants/a")...)
	require.NotZero(t, code)
	require.Contains(t, errOut, "an admin token cannot be confined")
	_, errOut, code = admin.run("", append(sec, "token", "create", "--role", "read", "--path", "tenants/a")...)
	require.NotZero(t, code)
	require.Contains(t, errOut, "not absolute and clean")

	a := []string{"--ca", files.CA, "--token-file", tok}
	require.Eventually(t, func() bool { // every node has applied the token
		_, _, code := admin.run("", append(a, "ls", "/")...)
		return code == 0
	}, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, "docs\n", admin.ok(append(a, "ls", "/")...))
	admin.ok(append(a, "put", local, "/docs/mine")...)
	require.Equal(t, "tenant b's", admin.ok(append(sec, "cat", "/tenants/a/docs/mine")...))
	for _, args := range [][]string{
		{"cat", "/tenants/b/secret"},
		{"cat", "/../b/secret"},
		{"rm", "/"},
	} {
		_, errOut, code := admin.run("", append(a, args...)...)
		require.NotZero(t, code, "%v", args)
		require.NotEmpty(t, errOut, "%v", args)
	}
	_, errOut, code = admin.run("", append(a, "token", "list")...)
	require.NotZero(t, code)
	require.Contains(t, errOut, "confined")
	require.Equal(t, "tenant b's", admin.ok(append(sec, "cat", "/tenants/b/secret")...))
}
