// Package authz decides what a caller may do: the one table of the role
// every gRPC method of the MemFS service, every command and every query
// needs, a caller's role from its certificate, and the hash tokens are
// stored under.
//
// It holds no state and does no I/O: the node (package server) finds the
// caller's certificate or token and asks here. Anything the tables do not
// name needs the node role, so a method or command added without an entry
// is closed to clients until one is written.
package authz

import (
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Methods is the role each method of the MemFS service needs. Apply and
// Query need at least this, and more for some commands and queries
// (Commands, Queries).
var Methods = map[string]pb.Role{
	pb.MemFS_Apply_FullMethodName:         pb.Role_ROLE_READ, // and Commands
	pb.MemFS_Query_FullMethodName:         pb.Role_ROLE_READ, // and Queries
	pb.MemFS_Write_FullMethodName:         pb.Role_ROLE_WRITE,
	pb.MemFS_Read_FullMethodName:          pb.Role_ROLE_READ,
	pb.MemFS_Status_FullMethodName:        pb.Role_ROLE_READ,
	pb.MemFS_Watch_FullMethodName:         pb.Role_ROLE_READ,
	pb.MemFS_Join_FullMethodName:          pb.Role_ROLE_ADMIN, // new nodes and `memfs node replace`
	pb.MemFS_RemoveNode_FullMethodName:    pb.Role_ROLE_ADMIN,
	pb.MemFS_MissingBlocks_FullMethodName: pb.Role_ROLE_NODE, // block sync between nodes
	pb.MemFS_FetchBlocks_FullMethodName:   pb.Role_ROLE_NODE,
}

// Commands is the role each operation of a Command needs, by its field
// name in Command's oneof. An open that only reads needs less (Command).
var Commands = map[protoreflect.Name]pb.Role{
	"open_session":   pb.Role_ROLE_READ,
	"keep_alive":     pb.Role_ROLE_READ,
	"close_session":  pb.Role_ROLE_READ,
	"open":           pb.Role_ROLE_WRITE, // plain read-only opens: ROLE_READ
	"close":          pb.Role_ROLE_READ,
	"grant":          pb.Role_ROLE_READ, // exclusive capabilities: ROLE_WRITE
	"release":        pb.Role_ROLE_READ,
	"write":          pb.Role_ROLE_WRITE,
	"mkdir":          pb.Role_ROLE_WRITE,
	"remove":         pb.Role_ROLE_WRITE,
	"rename":         pb.Role_ROLE_WRITE,
	"set_attr":       pb.Role_ROLE_WRITE,
	"symlink":        pb.Role_ROLE_WRITE,
	"link":           pb.Role_ROLE_WRITE,
	"mknod":          pb.Role_ROLE_WRITE,
	"set_xattr":      pb.Role_ROLE_WRITE,
	"remove_xattr":   pb.Role_ROLE_WRITE,
	"clone":          pb.Role_ROLE_WRITE,
	"reserve_inodes": pb.Role_ROLE_WRITE,
	"batch":          pb.Role_ROLE_WRITE, // and each command in it
	"lock":           pb.Role_ROLE_READ,  // a shared lock or an unlock; an exclusive lock needs write
	"token_create":   pb.Role_ROLE_ADMIN,
	"token_revoke":   pb.Role_ROLE_ADMIN,
	"touch":          pb.Role_ROLE_NODE,  // nodes send it before answering a read
	"tick":           pb.Role_ROLE_NODE,  // the leader's clock
	"leech":          pb.Role_ROLE_WRITE, // it ends in taking an exclusive capability
	"handoff":        pb.Role_ROLE_WRITE,
}

// Queries is the role each question of a Query needs, by its field name.
var Queries = map[protoreflect.Name]pb.Role{
	"stat":       pb.Role_ROLE_READ,
	"read":       pb.Role_ROLE_READ,
	"read_dir":   pb.Role_ROLE_READ,
	"readlink":   pb.Role_ROLE_READ,
	"get_xattr":  pb.Role_ROLE_READ,
	"list_xattr": pb.Role_ROLE_READ,
	"statfs":     pb.Role_ROLE_READ,
	"handle":     pb.Role_ROLE_READ,
	"usage":      pb.Role_ROLE_READ,
	"lock":       pb.Role_ROLE_READ,
	"tokens":     pb.Role_ROLE_ADMIN,
	"region":     pb.Role_ROLE_READ,
	"seek":       pb.Role_ROLE_READ,
}

// Open flags that make an open change the file (Linux values).
const (
	accMode = 3
	oCreat  = 0x40
	oTrunc  = 0x200
)

// Method is the role method needs; an unknown one needs the node role.
func Method(method string) pb.Role {
	if r, ok := Methods[method]; ok {
		return r
	}
	return pb.Role_ROLE_NODE
}

// Command is the role c needs.
func Command(c *pb.Command) pb.Role {
	if c == nil {
		return pb.Role_ROLE_READ // refused as malformed later
	}
	fd := c.ProtoReflect().WhichOneof(c.ProtoReflect().Descriptor().Oneofs().ByName("op"))
	if fd == nil {
		return pb.Role_ROLE_READ
	}
	r, ok := Commands[fd.Name()]
	if !ok {
		return pb.Role_ROLE_NODE
	}
	switch op := c.Op.(type) {
	case *pb.Command_Open:
		if f := op.Open.GetFlags(); f&accMode == 0 && f&(oCreat|oTrunc) == 0 && !op.Open.GetExclusive() {
			r = pb.Role_ROLE_READ
		}
	case *pb.Command_Grant:
		if op.Grant.GetExclusive() {
			r = pb.Role_ROLE_WRITE
		}
	case *pb.Command_Lock:
		if op.Lock.GetType() == pb.LockType_LOCK_WRITE {
			r = pb.Role_ROLE_WRITE
		}
	case *pb.Command_Batch:
		for _, nc := range op.Batch.GetCommands() {
			r = max(r, Command(nc))
		}
	}
	return r
}

// Query is the role q needs.
func Query(q *pb.Query) pb.Role {
	if q == nil {
		return pb.Role_ROLE_READ
	}
	fd := q.ProtoReflect().WhichOneof(q.ProtoReflect().Descriptor().Oneofs().ByName("q"))
	if fd == nil {
		return pb.Role_ROLE_READ
	}
	if r, ok := Queries[fd.Name()]; ok {
		return r
	}
	return pb.Role_ROLE_NODE
}

// CertRole is the role a verified certificate carries in its
// OrganizationalUnit (the highest, if several); ROLE_NONE if none.
func CertRole(cert *x509.Certificate) pb.Role {
	best := pb.Role_ROLE_NONE
	for _, ou := range cert.Subject.OrganizationalUnit {
		if r, err := ParseRole(ou); err == nil {
			best = max(best, r)
		}
	}
	return best
}

// pathScheme is pki.PathScheme (this package imports nothing of ours but
// the protocol).
const pathScheme = "memfs-path"

// CertPath is the directory a verified client certificate confines its
// holder to: the path of its URI SAN memfs-path:PATH, "" when it has
// none. Two different paths are an error (the certificate is refused).
func CertPath(cert *x509.Certificate) (string, error) {
	found := ""
	for _, u := range cert.URIs {
		if u.Scheme != pathScheme {
			continue
		}
		p := u.Opaque
		if p == "" {
			p = u.Path
		}
		if found != "" && p != found {
			return "", fmt.Errorf("certificate names two paths, %q and %q", found, p)
		}
		found = p
	}
	return found, nil
}

// ParseRole reads "read", "write", "admin" or "node".
func ParseRole(s string) (pb.Role, error) {
	switch strings.ToLower(s) {
	case "read":
		return pb.Role_ROLE_READ, nil
	case "write":
		return pb.Role_ROLE_WRITE, nil
	case "admin":
		return pb.Role_ROLE_ADMIN, nil
	case "node":
		return pb.Role_ROLE_NODE, nil
	}
	return pb.Role_ROLE_NONE, fmt.Errorf("unknown role %q (want read, write or admin)", s)
}

// RoleName is the lower-case name of r.
func RoleName(r pb.Role) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "ROLE_"))
}

// TokenHash is what the cluster stores of a token's text.
func TokenHash(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}
