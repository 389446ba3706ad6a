package faultnet

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
)

// recorder keeps every byte read through it so that they can be forwarded
// after the header has been decoded.
type recorder struct {
	r   io.Reader
	buf bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

// peekRaftSource reads the first RPC on a Raft connection far enough to
// learn the sender's server ID. It returns the ID and every byte consumed,
// which the caller must forward first.
func peekRaftSource(c net.Conn) (string, []byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	rec := &recorder{r: c}
	id, err := decodeRaftSource(bufio.NewReaderSize(rec, 512))
	if err != nil {
		return "", nil, err
	}
	return id, rec.buf.Bytes(), nil
}

// decodeRaftSource decodes the RPC type byte and the header of the request
// that follows it (every Raft request embeds an RPCHeader).
func decodeRaftSource(r io.Reader) (string, error) {
	var typ [1]byte
	if _, err := io.ReadFull(r, typ[:]); err != nil {
		return "", fmt.Errorf("raft rpc type: %w", err)
	}
	if typ[0] > 4 {
		return "", fmt.Errorf("raft rpc type %d unknown", typ[0])
	}
	// The header is embedded, so its fields (ID, Addr...) sit at the top
	// level of the encoded request; the other fields are skipped.
	var hdr raft.RPCHeader
	if err := codec.NewDecoder(r, &codec.MsgpackHandle{}).Decode(&hdr); err != nil {
		return "", fmt.Errorf("raft rpc header: %w", err)
	}
	if len(hdr.ID) == 0 {
		return "", fmt.Errorf("raft rpc without a server ID")
	}
	return string(hdr.ID), nil
}
