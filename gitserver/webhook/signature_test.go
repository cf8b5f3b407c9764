package webhook

import (
	"net/http"
	"testing"
)

// GitHub's documented test vector for X-Hub-Signature-256
// (docs.github.com, "Validating webhook deliveries").
const (
	ghSecret  = "It's a Secret to Everybody"
	ghPayload = "Hello, World!"
	ghSig     = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
)

func TestGitHubTestVector(t *testing.T) {
	if got := Sign([]byte(ghSecret), []byte(ghPayload)); got != ghSig {
		t.Fatalf("Sign = %s, want %s", got, ghSig)
	}
	h := http.Header{}
	h.Set(HeaderGitHubSignature, ghSig)
	if p := identify(h); p != GitHub {
		t.Fatalf("identified as %s", p)
	}
	if !Verify(GitHub, h, []byte(ghPayload), [][]byte{[]byte(ghSecret)}) {
		t.Fatal("GitHub's test vector does not verify")
	}
	// One flipped byte anywhere: the payload, the signature, the secret.
	flipped := []byte(ghPayload)
	flipped[0] ^= 1
	if Verify(GitHub, h, flipped, [][]byte{[]byte(ghSecret)}) {
		t.Fatal("a payload with one flipped byte verifies")
	}
	bad := []byte(ghSig)
	bad[len(bad)-1] = '6'
	h.Set(HeaderGitHubSignature, string(bad))
	if Verify(GitHub, h, []byte(ghPayload), [][]byte{[]byte(ghSecret)}) {
		t.Fatal("a signature with one changed digit verifies")
	}
	h.Set(HeaderGitHubSignature, ghSig)
	if Verify(GitHub, h, []byte(ghPayload), [][]byte{[]byte("It's a secret to Everybody")}) {
		t.Fatal("another secret verifies")
	}
	// During a rotation either secret verifies.
	if !Verify(GitHub, h, []byte(ghPayload), [][]byte{[]byte("new secret"), []byte(ghSecret)}) {
		t.Fatal("the previous secret does not verify during a rotation")
	}
}

func TestProviders(t *testing.T) {
	secret, body := []byte("s3cret"), []byte(`{"ref":"refs/heads/main"}`)
	hexSig := Sign(secret, body)[len("sha256="):]
	for _, tc := range []struct {
		name   string
		header map[string]string
		want   Provider
		ok     bool
	}{
		{"gitea", map[string]string{HeaderGiteaSignature: hexSig}, Gitea, true},
		// Gitea sends GitHub's header too; its own decides.
		{"gitea with github's header", map[string]string{HeaderGiteaSignature: hexSig, HeaderGitHubSignature: "sha256=00"}, Gitea, true},
		{"forgejo", map[string]string{HeaderForgejoSignature: hexSig}, Forgejo, true},
		{"gitlab", map[string]string{HeaderGitLabToken: "s3cret"}, GitLab, true},
		{"gitlab wrong token", map[string]string{HeaderGitLabToken: "s3cre"}, GitLab, false},
		{"generic", map[string]string{HeaderSignature: "sha256=" + hexSig}, Generic, true},
		{"generic without prefix", map[string]string{HeaderSignature: hexSig}, Generic, false},
		{"github without prefix", map[string]string{HeaderGitHubSignature: hexSig}, GitHub, false},
		{"gitea with prefix", map[string]string{HeaderGiteaSignature: "sha256=" + hexSig}, Gitea, false},
		{"not hex", map[string]string{HeaderGiteaSignature: "zz"}, Gitea, false},
		{"none", map[string]string{}, Generic, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			p := identify(h)
			if p != tc.want {
				t.Fatalf("identified as %s, want %s", p, tc.want)
			}
			if got := Verify(p, h, body, [][]byte{secret}); got != tc.ok {
				t.Fatalf("Verify = %v, want %v", got, tc.ok)
			}
			if Verify(p, h, body, nil) || Verify(p, h, body, [][]byte{nil}) {
				t.Fatal("verified without a secret")
			}
		})
	}
}
