package cluster

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// Nodes talk to each other over mutual TLS. The cluster's CA is made from
// the cluster key (its Ed25519 key is derived from it, and its certificate
// is the same bytes on every node), so every node that holds the key
// trusts the same CA, and nothing is handed out or stored: a node with
// another key (or none) completes no handshake with a member, either way.
// Each node signs a certificate of its own at start (a new key each time)
// naming it (the subject's common name), good for both ends of a
// connection. The HMAC node signature on every call (peer.go) stays as a
// second check, and must be by the node the certificate names.

// caEpoch fixes the CA certificate's validity, so it is the same on every
// node and at every start.
var (
	caNotBefore = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	caNotAfter  = time.Date(2120, 1, 1, 0, 0, 0, 0, time.UTC)
)

// leafLife is how long a node's certificate is good for: it is made anew
// at every start.
const leafLife = 5 * 365 * 24 * time.Hour

// NodeTLS is a node's TLS material: the cluster's CA, and the node's own
// certificate signed by it.
type NodeTLS struct {
	node  string
	roots *x509.CertPool
	cert  tls.Certificate
}

// NewNodeTLS makes node's TLS material from the cluster key.
func NewNodeTLS(key []byte, node string) (*NodeTLS, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("the cluster key is %d bytes: it must be 32", len(key))
	}
	caKey := ed25519.NewKeyFromSeed(derive(key, "shard node ca v1"))
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "shard cluster CA"},
		NotBefore:             caNotBefore,
		NotAfter:              caNotAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("the cluster's CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	leafTmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: node},
		NotBefore:    now.Add(-time.Hour), // clocks a little apart
		NotAfter:     now.Add(leafLife),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, leafKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("node %s's certificate: %w", node, err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	return &NodeTLS{node: node, roots: roots,
		cert: tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}}, nil
}

// Server is the TLS of this node's cluster port: TLS 1.3, and a client
// certificate of the cluster is required.
func (t *NodeTLS) Server() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    t.roots,
		NextProtos:   []string{"http/1.1"}, // exec streams and upgrades are HTTP/1.1
	}
}

// Client is the TLS of a call to node to: this node's certificate, and
// the server's must be the cluster's, for that node.
func (t *NodeTLS) Client(to string) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.cert},
		NextProtos:   []string{"http/1.1"},
		// The name checked is the node's, not the address dialled (a node
		// may move, or be reached by a name): VerifyConnection does it.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			node, err := t.verify(cs, x509.ExtKeyUsageServerAuth)
			if err != nil {
				return err
			}
			if node != to {
				return fmt.Errorf("the server's certificate is node %s's, not %s's", node, to)
			}
			return nil
		},
	}
}

// PeerNode is the node a verified connection's client certificate names.
func (t *NodeTLS) PeerNode(cs *tls.ConnectionState) (string, error) {
	if cs == nil {
		return "", errors.New("not a TLS connection")
	}
	return t.verify(*cs, x509.ExtKeyUsageClientAuth)
}

// verify checks that cs's peer certificate chains to the cluster's CA (for
// usage) and returns the node it names.
func (t *NodeTLS) verify(cs tls.ConnectionState, usage x509.ExtKeyUsage) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", errors.New("no certificate")
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: t.roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return "", fmt.Errorf("not a certificate of this cluster (another cluster key?): %w", err)
	}
	if leaf.Subject.CommonName == "" {
		return "", errors.New("the certificate names no node")
	}
	return leaf.Subject.CommonName, nil
}
