package fsm

import (
	"crypto/sha256"
	"encoding/hex"
	"syscall"

	pb "github.com/memoryfs/memfs/memfspb"
)

// A token is a bearer credential's SHA-256 with the role it grants. The
// state machine stores and lists tokens; it never sees a token's text and
// never checks one (the node does, on every request, with Token).
type token struct {
	hash    [sha256.Size]byte
	role    pb.Role
	name    string
	created int64  // log time
	expires int64  // log time; 0: never
	path    string // the directory its holder is confined to; "": none
}

// Limits of tokens.
const (
	maxTokens      = 1 << 16
	maxTokenTTLms  = 100 * 365 * 24 * 3600 * 1000
	tokenIDBytes   = 8
	maxTokenName   = 255
	tokenIDHexSize = 2 * tokenIDBytes
)

// TokenID is the public name of a token: the first 8 bytes of its hash,
// in hex. `memfs token create` prints it, `revoke` takes it.
func TokenID(hash []byte) string {
	if len(hash) < tokenIDBytes {
		return ""
	}
	return hex.EncodeToString(hash[:tokenIDBytes])
}

func (k *token) describe() *pb.Token {
	return &pb.Token{Id: TokenID(k.hash[:]), Role: k.role, Name: k.name, CreatedNs: k.created, ExpiresNs: k.expires, Path: k.path}
}

func validTokenRole(r pb.Role) bool {
	return r == pb.Role_ROLE_READ || r == pb.Role_ROLE_WRITE || r == pb.Role_ROLE_ADMIN
}

func (t *tx) tokenCreate(x *pb.TokenCreateCmd) (*pb.Result, error) {
	switch {
	case len(x.Hash) != sha256.Size:
		return nil, errf(syscall.EINVAL, "token hash of %d bytes, want %d", len(x.Hash), sha256.Size)
	case !validTokenRole(x.Role):
		return nil, errf(syscall.EINVAL, "token role %v: want read, write or admin", x.Role)
	case len(x.Name) > maxTokenName:
		return nil, errf(syscall.ENAMETOOLONG, "token name of %d bytes", len(x.Name))
	case x.TtlMs < 0 || x.TtlMs > maxTokenTTLms:
		return nil, errf(syscall.EINVAL, "token lifetime %d ms", x.TtlMs)
	case x.Path != "" && x.Role == pb.Role_ROLE_ADMIN:
		return nil, errf(syscall.EINVAL, "an admin token cannot be confined to a path: it could make tokens for any")
	}
	if x.Path != "" {
		if err := CheckRoot(x.Path); err != nil {
			return nil, err
		}
	}
	if _, ok := t.tokens.get(x.Hash); ok {
		return nil, errf(syscall.EEXIST, "token %s exists", TokenID(x.Hash))
	}
	if t.tokens.len() >= maxTokens {
		return nil, errf(syscall.ENOSPC, "%d tokens stored; revoke some", maxTokens)
	}
	k := &token{role: x.Role, name: x.Name, created: t.now, path: x.Path}
	copy(k.hash[:], x.Hash)
	if x.TtlMs > 0 {
		k.expires = t.now + x.TtlMs*1e6
	}
	t.tokens.put(k.hash[:], k)
	return &pb.Result{Tokens: []*pb.Token{k.describe()}}, nil
}

func (t *tx) tokenRevoke(x *pb.TokenRevokeCmd) (*pb.Result, error) {
	if len(x.Id) != tokenIDHexSize {
		return nil, errf(syscall.EINVAL, "token id %q: want %d hex digits", x.Id, tokenIDHexSize)
	}
	prefix, err := hex.DecodeString(x.Id)
	if err != nil {
		return nil, errf(syscall.EINVAL, "token id %q: %v", x.Id, err)
	}
	var found *token
	t.tokens.root().WalkPrefix(prefix, func(_ []byte, k *token) bool {
		found = k
		return true
	})
	if found == nil {
		return nil, errf(syscall.ENOENT, "no token %s", x.Id)
	}
	t.tokens.del(found.hash[:])
	return &pb.Result{Tokens: []*pb.Token{found.describe()}}, nil
}

func (s *state) listTokens() *pb.Result {
	var out []*pb.Token
	s.tokens.root().Walk(func(_ []byte, k *token) bool {
		out = append(out, k.describe())
		return false
	})
	return &pb.Result{Tokens: out}
}

// Token returns the stored token whose hash is hash (its role and times),
// or nil. Expiry is the caller's to judge, against its own clock.
func (f *FSM) Token(hash []byte) *pb.Token {
	if len(hash) != sha256.Size {
		return nil
	}
	k, ok := f.cur.Load().tokens.get(hash)
	if !ok {
		return nil
	}
	return k.describe()
}
