package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
)

// NewKey makes a private key of the kind every bex certificate has: ECDSA P-256.
func NewKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

// Serial is a random 127-bit serial number.
func Serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// Sign signs tmpl for the public key pub with parent and its key signer, or, when
// parent is nil, self-signed with signer (whose public key is then pub). A
// template without a serial number gets a random one. It returns the
// certificate's DER.
func Sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) ([]byte, error) {
	if tmpl.SerialNumber == nil {
		serial, err := Serial()
		if err != nil {
			return nil, err
		}
		tmpl.SerialNumber = serial
	}
	if parent == nil {
		parent = tmpl
	}
	return x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
}

// NewCA makes a key and a self-signed CA certificate of tmpl, marked as a CA
// (basic constraints). tmpl says the rest: subject, key usage, validity.
func NewCA(tmpl *x509.Certificate) (cert *x509.Certificate, key *ecdsa.PrivateKey, der []byte, err error) {
	key, err = NewKey()
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl.BasicConstraintsValid = true
	tmpl.IsCA = true
	der, err = Sign(tmpl, nil, key.Public(), key)
	if err != nil {
		return nil, nil, nil, err
	}
	cert, err = x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, err
	}
	return cert, key, der, nil
}

// EncodeCert is a certificate's DER as PEM.
func EncodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// EncodeKey is an ECDSA private key as PEM ("EC PRIVATE KEY", SEC 1).
func EncodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// WriteCert writes a certificate's DER as PEM to path with mode.
func WriteCert(path string, der []byte, mode os.FileMode) error {
	return WriteFile(path, EncodeCert(der), mode)
}

// WriteKey writes a private key as PEM to path, readable by its owner only.
func WriteKey(path string, key crypto.Signer) error {
	ec, ok := key.(*ecdsa.PrivateKey)
	if !ok {
		return errors.New("only ECDSA keys are written")
	}
	data, err := EncodeKey(ec)
	if err != nil {
		return err
	}
	return WriteFile(path, data, 0o600)
}

// WritePEM writes der as one PEM block of type typ to path with mode.
func WritePEM(path, typ string, der []byte, mode os.FileMode) error {
	return WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

// WriteFile writes data through a temporary file and a rename, so that a crash
// never leaves half a certificate or key behind.
func WriteFile(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ErrNotPEM is Load's error for a file that holds no PEM block; callers say what
// to do about it (which files to remove).
var ErrNotPEM = errors.New("a certificate or key is not PEM")

// Load reads a certificate and its ECDSA key from PEM files. It returns the
// certificate's PEM too, for clients to trust.
func Load(certPath, keyPath string) (cert *x509.Certificate, key *ecdsa.PrivateKey, certPEM []byte, err error) {
	certPEM, err = os.ReadFile(certPath)
	if err != nil {
		return nil, nil, nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, nil, ErrNotPEM
	}
	if cert, err = x509.ParseCertificate(cb.Bytes); err != nil {
		return nil, nil, nil, err
	}
	if key, err = x509.ParseECPrivateKey(kb.Bytes); err != nil {
		return nil, nil, nil, err
	}
	return cert, key, certPEM, nil
}
