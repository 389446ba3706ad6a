package hostile_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/internal/tlsconf"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/authz"
	"github.com/memoryfs/memfs/server/servertest"
)

// prefixAttacker holds a write token confined to another directory than
// the honest client's files, and tries to reach them anyway: by path,
// through .., by inode numbers guessed from 1 up, by parent and name, by
// a handle number of another session, and by renaming and linking out.
type prefixAttacker struct {
	cl     *client.Client
	maxIno uint64 // the highest inode number guessed
	realIn uint64 // the real number of its own directory
}

// mineIno asks, as the attacker, the inode number of its own /mine.
func (a *prefixAttacker) mineIno(ctx context.Context) (uint64, error) {
	r, err := a.cl.Query(ctx, &pb.Query{Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: &pb.Loc{Path: "/mine"}}}})
	if err != nil {
		return 0, err
	}
	return r.Attr.GetIno(), nil
}

// malloryToken is the confined token's text.
const malloryToken = "mallory's confined token"

// newPrefixAttacker makes mallory's directory and token with admin and
// dials the attacker in this process.
func newPrefixAttacker(t *testing.T, c *servertest.Cluster, admin *client.Client) *prefixAttacker {
	t.Helper()
	realIn := confineMallory(t, c, admin)
	a, err := dialPrefixAttacker(context.Background(), c.APIAddrs(), c.CertFiles("admin").CA, realIn, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.cl.Close() })
	return a
}

// confineMallory makes /tenants/mallory and a write token confined to it,
// waits until every node knows the token, and returns the directory's
// inode number.
func confineMallory(t *testing.T, c *servertest.Cluster, admin *client.Client) uint64 {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, admin.MkdirAll("/tenants/mallory", 0o755))
	_, err := admin.Do(ctx, &pb.Command{Op: &pb.Command_TokenCreate{TokenCreate: &pb.TokenCreateCmd{
		Hash: authz.TokenHash(malloryToken), Role: pb.Role_ROLE_WRITE, Path: "/tenants/mallory"}}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		for _, n := range c.Nodes() {
			if n.FSM().Token(authz.TokenHash(malloryToken)) == nil {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond)
	st, err := admin.Query(ctx, &pb.Query{Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: &pb.Loc{Path: "/tenants/mallory"}}}})
	require.NoError(t, err)
	return st.Attr.Ino
}

// dialPrefixAttacker connects with mallory's token (trusting the CA in
// caFile, through dial or the default dialer) and writes its /mine;
// realIn is its directory's inode number.
func dialPrefixAttacker(ctx context.Context, addrs []string, caFile string, realIn uint64, dial client.Dialer) (*prefixAttacker, error) {
	caOnly, err := tlsconf.Load(tlsconf.Files{CA: caFile}, nil)
	if err != nil {
		return nil, err
	}
	cl, err := client.New(ctx, addrs, client.WithTLS(caOnly.ClientConfig()), client.WithToken(malloryToken),
		client.WithRetryTimeout(10*time.Second), client.WithDialer(dial))
	if err != nil {
		return nil, err
	}
	if err := cl.WriteFile("/mine", []byte("mallory's"), 0o644); err != nil {
		_ = cl.Close()
		return nil, err
	}
	return &prefixAttacker{cl: cl, maxIno: realIn + 512, realIn: realIn}, nil
}

// allowed says whether err is what a refused or fruitless attempt gets.
func allowed(err error) bool {
	switch {
	case err == nil:
		return false
	case status.Code(err) == codes.PermissionDenied,
		errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.EBADF), errors.Is(err, syscall.EACCES),
		errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EINVAL):
		return true
	case status.Code(err) == codes.DeadlineExceeded, status.Code(err) == codes.Unavailable:
		return true // a busy machine
	}
	return false
}

// attack makes one round of attempts and returns what got through: any
// answer naming something outside its directory.
func (a *prefixAttacker) attack(ctx context.Context, ino uint64) []string {
	var leaks []string
	leak := func(what string, err error) {
		if !allowed(err) {
			leaks = append(leaks, fmt.Sprintf("%s: %v", what, err))
		}
	}
	_, err := a.cl.ReadFile("/big")
	leak("read /big", err)
	_, err = a.cl.ReadFile("/../../big")
	leak("read /../../big", err)
	if err := a.cl.WriteFile("/../../idle-0", []byte("x"), 0o644); err != nil {
		leak("write /../../idle-0", err)
	} else {
		// Written inside: its own /idle-0, harmless. Anything else leaks.
		_, err := a.cl.Stat("/idle-0")
		if err != nil {
			leaks = append(leaks, "a write through .. went somewhere else")
		}
		_ = a.cl.Remove("/idle-0")
	}
	r, err := a.cl.Query(ctx, &pb.Query{Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: &pb.Loc{Ino: ino}}}})
	if err == nil {
		// Only its own tree answers: its root as 1 and /mine.
		if ino != 1 && r.Attr.Ino != ino || ino == a.realIn {
			leaks = append(leaks, fmt.Sprintf("stat of inode %d answered %v", ino, r.Attr))
		}
		mine, err := a.mineIno(ctx)
		if ino != 1 && (err != nil || mine != ino) {
			leaks = append(leaks, fmt.Sprintf("stat of inode %d answered %v", ino, r.Attr))
		}
	} else {
		leak(fmt.Sprintf("stat of inode %d", ino), err)
	}
	_, err = a.cl.Do(ctx, &pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: &pb.Loc{Parent: a.realIn, Name: "big"}}}})
	leak("remove /big by parent and name", err)
	_, _, err = a.cl.WriteIno(ctx, ino, 0, []byte("overwritten"))
	if ino == 1 || err == nil {
		// Its root, a directory; or its own file, which it may write.
		_ = a.cl.WriteFile("/mine", []byte("mallory's"), 0o644)
	} else {
		leak(fmt.Sprintf("write to inode %d", ino), err)
	}
	_, err = a.cl.ReadHandle(ctx, ino, 0, make([]byte, 16)) // a handle number of someone else
	leak(fmt.Sprintf("read through handle %d", ino), err)
	_, err = a.cl.Do(ctx, &pb.Command{Op: &pb.Command_Rename{Rename: &pb.RenameCmd{
		Src: &pb.Loc{Path: "/mine"}, Dst: &pb.Loc{Parent: a.realIn, Name: "stolen"}}}})
	leak("rename out", err)
	_, err = a.cl.Do(ctx, &pb.Command{Op: &pb.Command_Link{Link: &pb.LinkCmd{
		Src: &pb.Loc{Ino: ino}, Dst: &pb.Loc{Path: "/link"}}}})
	if err == nil {
		// Its own file it may link; anything else leaks.
		mine, err := a.mineIno(ctx)
		if err != nil || mine != ino {
			leaks = append(leaks, fmt.Sprintf("linked inode %d in", ino))
		}
		_ = a.cl.Remove("/link")
	} else if !errors.Is(err, syscall.EPERM) && !errors.Is(err, fs.ErrExist) { // a directory, or its own file linked before
		leak(fmt.Sprintf("link of inode %d", ino), err)
	}
	return leaks
}

// TestTokenForAnotherPrefix runs the confined attacker on its own beside
// an honest client: nothing it tries reaches the honest files, which stay
// as they were.
func TestTokenForAnotherPrefix(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithTLS())
	honest := tlsClient(t, c)
	ctx := context.Background()
	require.NoError(t, honest.WriteFile("/big", []byte("honest data"), 0o644))
	for i := range 20 {
		require.NoError(t, honest.WriteFile(fmt.Sprintf("/idle-%d", i), []byte("honest"), 0o644))
	}
	a := newPrefixAttacker(t, c, honest)
	for ino := uint64(1); ino <= a.maxIno; ino += 7 {
		require.Empty(t, a.attack(ctx, ino))
	}
	// Its own file's number: what it may do with it is no leak.
	mine, err := a.mineIno(ctx)
	require.NoError(t, err)
	require.Empty(t, a.attack(ctx, mine))
	got, err := honest.ReadFile("/big")
	require.NoError(t, err)
	require.Equal(t, "honest data", string(got))
	for i := range 20 {
		got, err := honest.ReadFile(fmt.Sprintf("/idle-%d", i))
		require.NoError(t, err)
		require.Equal(t, "honest", string(got))
	}
	ents, err := honest.ReadDir("/")
	require.NoError(t, err)
	require.Len(t, ents, 22, "/big, /idle-*, /tenants")
}
