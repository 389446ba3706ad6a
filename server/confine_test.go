package server_test

import (
	"context"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/internal/pki"
	"github.com/memoryfs/memfs/internal/tlsconf"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/authz"
	"github.com/memoryfs/memfs/server/servertest"
)

// confinedTree is what the admin makes before a confined client comes:
// /a is the confinement, /out and /shared lie outside.
type confinedTree struct {
	admin                   *client.Client
	c                       *servertest.Cluster
	secret, outDir, realA   uint64 // outside: /out/secret, /out; and /a itself
	in, sub, linked, shared uint64 // inside: /a/in, /a/sub, /a/hl (a link of /shared)
}

func newConfinedTree(t *testing.T) *confinedTree {
	c := servertest.StartCluster(t, 3, servertest.WithTLS())
	admin, _ := tlsClient(t, c, "admin")
	for _, d := range []string{"/a", "/a/sub", "/out"} {
		require.NoError(t, admin.Mkdir(d, 0o755))
	}
	require.NoError(t, admin.WriteFile("/a/in", []byte("inside"), 0o644))
	require.NoError(t, admin.WriteFile("/out/secret", []byte("outside"), 0o644))
	require.NoError(t, admin.WriteFile("/shared", []byte("shared"), 0o644))
	require.NoError(t, admin.Link("/shared", "/a/hl"))
	require.NoError(t, admin.Symlink("../out/secret", "/a/esc"))
	require.NoError(t, admin.Symlink("/in", "/a/abs"))
	ino := func(p string) uint64 {
		a, err := admin.Query(context.Background(), &pb.Query{Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: &pb.Loc{Path: p, Nofollow: true}}}})
		require.NoError(t, err)
		return a.Attr.Ino
	}
	return &confinedTree{admin: admin, c: c,
		secret: ino("/out/secret"), outDir: ino("/out"), realA: ino("/a"),
		in: ino("/a/in"), sub: ino("/a/sub"), linked: ino("/a/hl"), shared: ino("/shared")}
}

// tokenClient makes a token of role confined to path and connects with it.
func (ct *confinedTree) tokenClient(t *testing.T, role pb.Role, path string) *client.Client {
	text := "confined " + path + " " + authz.RoleName(role)
	_, err := ct.admin.Do(context.Background(), &pb.Command{Op: &pb.Command_TokenCreate{TokenCreate: &pb.TokenCreateCmd{
		Hash: authz.TokenHash(text), Role: role, Path: path}}})
	require.NoError(t, err)
	caOnly := loadTLS(t, tlsconf.Files{CA: ct.c.CertFiles("admin").CA})
	var cl *client.Client
	// Every node must know the token: the client may talk to any.
	require.Eventually(t, func() bool {
		for _, n := range ct.c.Nodes() {
			if n.FSM().Token(authz.TokenHash(text)) == nil {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond)
	cl, err = client.New(context.Background(), ct.c.APIAddrs(), client.WithTLS(caOnly.ClientConfig()),
		client.WithToken(text), client.WithRetryTimeout(10*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func clientStat(ctx context.Context, cl *client.Client, loc *pb.Loc) (*pb.Result, error) {
	return cl.Query(ctx, &pb.Query{Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: loc}}})
}

// refused requires the refusal of a request naming an inode outside the
// confinement: PermissionDenied before any work (EACCES to a mount).
func refused(t *testing.T, err error, what string) {
	t.Helper()
	require.Error(t, err, what)
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%s: %v", what, err)
	require.ErrorIs(t, err, syscall.EACCES, what)
}

// TestConfinedToken: a token confined to /a sees /a as its root, inode 1,
// reaches nothing outside by any path, symlink or inode number, and what
// it is refused changes nothing.
func TestConfinedToken(t *testing.T) {
	ct := newConfinedTree(t)
	cl := ct.tokenClient(t, pb.Role_ROLE_WRITE, "/a")
	ctx := context.Background()
	before := dumpTree(t, ct.admin, "/out")

	root, err := clientStat(ctx, cl, &pb.Loc{Path: "/"})
	require.NoError(t, err)
	require.EqualValues(t, 1, root.Attr.Ino, "the confinement is the client's root, inode 1")

	read := func(p string) (string, error) {
		b, err := cl.ReadFile(p)
		return string(b), err
	}
	paths := []struct {
		name, path string
		want       string // "" when it must not exist
	}{
		{"a file inside", "/in", "inside"},
		{".. stops at the root", "/../in", "inside"},
		{"many ..", "/sub/../../../../in", "inside"},
		{".. cannot reach outside", "/../out/secret", ""},
		{"a relative symlink climbing out", "/esc", ""},
		{"an absolute symlink is resolved from the root", "/abs", "inside"},
		{"a hard link made by the admin", "/hl", "shared"},
		{"the real path of a file outside", "/out/secret", ""},
	}
	for _, p := range paths {
		got, err := read(p.path)
		if p.want == "" {
			require.ErrorIs(t, err, fs.ErrNotExist, "%s: %s", p.name, p.path)
			continue
		}
		require.NoError(t, err, p.name)
		require.Equal(t, p.want, got, p.name)
	}
	ents, err := cl.ReadDir("/")
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	require.ElementsMatch(t, []string{"abs", "esc", "hl", "in", "sub"}, names)

	// Changes by path land inside, whatever the path says.
	require.NoError(t, cl.WriteFile("/../new", []byte("made inside"), 0o644))
	got, err := ct.admin.ReadFile("/a/new")
	require.NoError(t, err)
	require.Equal(t, "made inside", string(got))
	require.ErrorIs(t, cl.Rename("/new", "/../out/new"), fs.ErrNotExist, "rename out: /a/out does not exist")
	require.NoError(t, cl.Rename("/new", "/../../new2"))
	_, err = ct.admin.Stat("/a/new2")
	require.NoError(t, err, "the rename stayed inside")
	require.NoError(t, cl.Link("/in", "/../link"))
	_, err = ct.admin.Stat("/a/link")
	require.NoError(t, err, "the link stayed inside")
	require.ErrorIs(t, cl.Remove("/"), syscall.EBUSY, "its root is not its to remove")

	// Inode numbers from outside: refused before any work.
	byIno := []struct {
		name string
		do   func() error
	}{
		{"stat of a file outside", func() error { _, err := clientStat(ctx, cl, &pb.Loc{Ino: ct.secret}); return err }},
		{"stat of the real /a's number (the real root to it)", func() error { _, err := clientStat(ctx, cl, &pb.Loc{Ino: ct.realA}); return err }},
		{"lookup in a directory outside", func() error { _, err := cl.Lookup(ctx, ct.outDir, "secret"); return err }},
		{"read by inode", func() error { _, err := cl.ReadIno(ctx, ct.secret, 0, make([]byte, 10)); return err }},
		{"write by inode", func() error { _, _, err := cl.WriteIno(ctx, ct.secret, 0, []byte("x")); return err }},
		{"readdir by inode", func() error { _, err := cl.ReadDirIno(ctx, ct.outDir); return err }},
		{"remove by parent and name", func() error {
			_, err := cl.Do(ctx, &pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: &pb.Loc{Parent: ct.outDir, Name: "secret"}}}})
			return err
		}},
		{"rename out by parent and name", func() error {
			_, err := cl.Do(ctx, &pb.Command{Op: &pb.Command_Rename{Rename: &pb.RenameCmd{
				Src: &pb.Loc{Path: "/in"}, Dst: &pb.Loc{Parent: ct.outDir, Name: "stolen"}}}})
			return err
		}},
		{"link out", func() error {
			_, err := cl.Do(ctx, &pb.Command{Op: &pb.Command_Link{Link: &pb.LinkCmd{
				Src: &pb.Loc{Ino: ct.secret}, Dst: &pb.Loc{Path: "/secret"}}}})
			return err
		}},
		{"setattr", func() error {
			_, err := cl.SetAttr(ctx, &pb.SetAttrCmd{Loc: &pb.Loc{Ino: ct.secret}, Valid: uint32(pb.SetAttrBit_SET_MODE), Mode: 0o777})
			return err
		}},
		{"xattr", func() error {
			_, err := cl.Query(ctx, &pb.Query{Q: &pb.Query_ListXattr{ListXattr: &pb.ListXattrQuery{Loc: &pb.Loc{Ino: ct.secret}}}})
			return err
		}},
		{"open", func() error {
			_, _, err := cl.OpenLoc(ctx, &pb.Loc{Ino: ct.secret}, 0, 0, 0, 0, false, false)
			return err
		}},
		{"grant", func() error {
			_, err := cl.Do(ctx, &pb.Command{Op: &pb.Command_Grant{Grant: &pb.GrantCmd{Inos: []uint64{ct.outDir}, WithEntries: true}}})
			return err
		}},
		{"lock", func() error {
			_, err := cl.Do(ctx, &pb.Command{Op: &pb.Command_Lock{Lock: &pb.LockCmd{Ino: ct.secret, Owner: 1, Type: pb.LockType_LOCK_WRITE, End: 10}}})
			return err
		}},
		{"clone out", func() error {
			_, err := cl.Do(ctx, &pb.Command{Op: &pb.Command_Clone{Clone: &pb.CloneCmd{Src: &pb.Loc{Ino: ct.outDir}, Dst: &pb.Loc{Path: "/copy"}, Recursive: true}}})
			return err
		}},
		{"a batch with one command outside", func() error {
			_, err := cl.Do(ctx, &pb.Command{Op: &pb.Command_Batch{Batch: &pb.BatchCmd{Commands: []*pb.Command{
				{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: "/ok"}}}},
				{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: &pb.Loc{Ino: ct.secret}}}},
			}}}})
			return err
		}},
	}
	for _, op := range byIno {
		refused(t, op.do(), op.name)
	}
	require.Equal(t, before, dumpTree(t, ct.admin, "/out"), "nothing outside changed")
	_, err = ct.admin.Stat("/a/ok")
	require.ErrorIs(t, err, fs.ErrNotExist, "the refused batch changed nothing")

	// Inside by number: its root as 1, a file, a link across the boundary.
	a, err := clientStat(ctx, cl, &pb.Loc{Ino: 1})
	require.NoError(t, err)
	require.EqualValues(t, 1, a.Attr.Ino)
	in, err := cl.Lookup(ctx, 1, "in")
	require.NoError(t, err)
	require.Equal(t, ct.in, in.Ino)
	up, err := cl.Lookup(ctx, ct.sub, "..")
	require.NoError(t, err)
	require.EqualValues(t, 1, up.Ino, "the parent of /sub is the client's root")
	top, err := cl.Lookup(ctx, 1, "..")
	require.NoError(t, err)
	require.EqualValues(t, 1, top.Ino, "the root's parent is itself")
	_, err = clientStat(ctx, cl, &pb.Loc{Ino: ct.linked})
	require.NoError(t, err, "a file with a name inside")
	des, err := cl.ReadDirIno(ctx, 1)
	require.NoError(t, err)
	for _, d := range des {
		require.NotEqual(t, ct.realA, d.Ino, "the real number of its root never shows")
	}

	// A file unlinked while the client holds it open stays its own.
	h, attr, err := cl.OpenLoc(ctx, &pb.Loc{Path: "/tmp"}, 0x42, 0o600, 0, 0, false, false)
	require.NoError(t, err)
	require.NoError(t, cl.Remove("/tmp"))
	_, err = clientStat(ctx, cl, &pb.Loc{Ino: attr.Ino})
	require.NoError(t, err, "an unlinked file it holds open")
	_, _, err = cl.WriteHandle(ctx, h, 0, []byte("still mine"))
	require.NoError(t, err)
	require.NoError(t, cl.CloseHandle(ctx, h))

	// A handle of another client is not its to read.
	ah, _, err := ct.admin.OpenLoc(ctx, &pb.Loc{Path: "/out/secret"}, 0, 0, 0, 0, false, false)
	require.NoError(t, err)
	_, err = cl.ReadHandle(ctx, ah, 0, make([]byte, 10))
	require.ErrorIs(t, err, syscall.EBADF)

	// A directory renamed out of the confinement leaves it.
	require.NoError(t, ct.admin.Rename("/a/sub", "/out/sub"))
	_, err = clientStat(ctx, cl, &pb.Loc{Ino: ct.sub})
	refused(t, err, "a directory renamed out")

	// Every inode number the cluster has handed out: only what is inside
	// answers, and under the client's numbering.
	inside := map[uint64]bool{}
	for _, p := range []string{"/a", "/a/in", "/a/hl", "/a/esc", "/a/abs", "/a/new2", "/a/link"} {
		r, err := clientStat(ctx, ct.admin, &pb.Loc{Path: p, Nofollow: true})
		require.NoError(t, err)
		inside[r.Attr.Ino] = true
	}
	for ino := uint64(1); ino < ct.realA+64; ino++ {
		r, err := clientStat(ctx, cl, &pb.Loc{Ino: ino})
		if err != nil {
			continue
		}
		real := ino
		switch ino {
		case 1:
			real = ct.realA
		case ct.realA:
			real = 1
		}
		require.True(t, inside[real], "inode %d (real %d) answered: %v", ino, real, r.Attr)
	}

	// A confined client does not manage tokens or members.
	_, err = cl.Do(ctx, &pb.Command{Op: &pb.Command_TokenCreate{TokenCreate: &pb.TokenCreateCmd{
		Hash: authz.TokenHash("y"), Role: pb.Role_ROLE_WRITE}}})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
}

// TestConfinedWatch: a confined client's change events name only what
// changed inside, in its numbering.
func TestConfinedWatch(t *testing.T) {
	ct := newConfinedTree(t)
	cl := ct.tokenClient(t, pb.Role_ROLE_READ, "/a")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs, err := cl.Watch(ctx)
	require.NoError(t, err)
	require.NoError(t, ct.admin.WriteFile("/out/secret", []byte("changed outside"), 0o644))
	require.NoError(t, ct.admin.WriteFile("/out/more", []byte("new outside"), 0o644))
	require.NoError(t, ct.admin.WriteFile("/a/in", []byte("changed inside"), 0o644))
	require.NoError(t, ct.admin.WriteFile("/a/made", []byte("new inside"), 0o644))
	var inodes []uint64
	var names []string
	deadline := time.After(30 * time.Second)
	for !slices.Contains(names, "made") {
		select {
		case ev := <-evs:
			inodes = append(inodes, ev.Inodes...)
			for _, e := range ev.Entries {
				require.EqualValues(t, 1, e.Ino, "only entries of its root changed: %v", e)
				names = append(names, e.Name)
			}
			for _, r := range ev.Recalls {
				require.NotEqual(t, ct.secret, r.Ino)
			}
		case <-deadline:
			t.Fatalf("no event for /a/made; got inodes %v names %v", inodes, names)
		}
	}
	require.Contains(t, inodes, ct.in)
	require.NotContains(t, inodes, ct.secret)
	require.NotContains(t, inodes, ct.outDir)
	require.NotContains(t, inodes, ct.realA, "its root is inode 1 to it")
	require.NotContains(t, names, "more")
}

// TestConfinedCertificate: a certificate with a memfs-path URI SAN is
// confined like a token; one for a missing directory sees nothing.
func TestConfinedCertificate(t *testing.T) {
	ct := newConfinedTree(t)
	dir := t.TempDir()
	caFile := ct.c.CertFiles("admin").CA
	dial := func(name, path string) *client.Client {
		src := loadTLS(t, issue(t, ct.c.CA(), dir, caFile, pki.Request{Name: name, Role: pki.RoleWrite, Path: path}))
		cl, err := client.New(context.Background(), ct.c.APIAddrs(), client.WithTLS(src.ClientConfig()), client.WithRetryTimeout(10*time.Second))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	cl := dial("tenant-a", "/a")
	got, err := cl.ReadFile("/in")
	require.NoError(t, err)
	require.Equal(t, "inside", string(got))
	_, err = clientStat(context.Background(), cl, &pb.Loc{Ino: ct.secret})
	refused(t, err, "stat outside")

	none := dial("tenant-b", "/b")
	_, err = none.Stat("/")
	require.ErrorIs(t, err, fs.ErrNotExist, "its directory does not exist")
	require.Error(t, none.WriteFile("/f", []byte("x"), 0o644))
	_, err = ct.admin.Stat("/f")
	require.ErrorIs(t, err, fs.ErrNotExist)

	_, err = ct.c.CA().Issue(pki.Request{Name: "x", Role: pki.RoleAdmin, Path: "/a"})
	require.Error(t, err, "an admin certificate cannot be confined")
}

// dumpTree lists every name under p with its size, for "nothing changed".
func dumpTree(t *testing.T, cl *client.Client, p string) string {
	t.Helper()
	var b strings.Builder
	ents, err := cl.ReadDir(p)
	require.NoError(t, err)
	for _, e := range ents {
		info, err := e.Info()
		require.NoError(t, err)
		fmt.Fprintf(&b, "%s %v %d\n", e.Name(), info.Mode(), info.Size())
		if e.IsDir() {
			b.WriteString(dumpTree(t, cl, p+"/"+e.Name()))
		}
	}
	return b.String()
}
