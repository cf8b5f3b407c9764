package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
)

// Provider is who signed a delivery, told by its signature header.
type Provider string

// The providers, each with its own signature header.
const (
	// GitHub: X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>.
	GitHub Provider = "github"
	// Gitea: X-Gitea-Signature: <hex HMAC-SHA256 of the body>.
	Gitea Provider = "gitea"
	// Forgejo: X-Forgejo-Signature: <hex HMAC-SHA256 of the body>.
	Forgejo Provider = "forgejo"
	// GitLab: X-Gitlab-Token: <the secret itself>; GitLab signs nothing.
	GitLab Provider = "gitlab"
	// Generic is bex's own, for CI systems and curl: X-Bex-Signature-256:
	// sha256=<hex HMAC-SHA256 of the body>, as GitHub's.
	Generic Provider = "generic"
)

// Signature headers.
const (
	HeaderGitHubSignature  = "X-Hub-Signature-256"
	HeaderGiteaSignature   = "X-Gitea-Signature"
	HeaderForgejoSignature = "X-Forgejo-Signature"
	HeaderGitLabToken      = "X-Gitlab-Token"
	HeaderSignature        = "X-Bex-Signature-256"
	// HeaderEvent and HeaderDelivery are the generic form's event ("push" when
	// absent, or "ping") and delivery id (optional: without one there is no
	// deduplication).
	HeaderEvent    = "X-Bex-Event"
	HeaderDelivery = "X-Bex-Delivery"
)

// identify finds the provider by its signature header. Gitea also sends GitHub's
// headers, so the more specific ones are looked at first; a request with none is
// the generic form (whose signature is then missing, and refused).
func identify(h http.Header) Provider {
	switch {
	case h.Get(HeaderForgejoSignature) != "":
		return Forgejo
	case h.Get(HeaderGiteaSignature) != "":
		return Gitea
	case h.Get(HeaderGitLabToken) != "":
		return GitLab
	case h.Get(HeaderGitHubSignature) != "":
		return GitHub
	}
	return Generic
}

// Verify reports whether the delivery's signature (or GitLab's token) matches one
// of secrets. Comparisons take the same time whatever the mismatch.
func Verify(p Provider, h http.Header, body []byte, secrets [][]byte) bool {
	ok := false
	for _, secret := range secrets {
		if len(secret) == 0 {
			continue
		}
		// No early return: with two secrets valid (a rotation), the time taken
		// does not say which one matched.
		if verifyOne(p, h, body, secret) {
			ok = true
		}
	}
	return ok
}

// signatureOf is the header that carries p's signature (GitLab's token), as sent.
func signatureOf(p Provider, h http.Header) string {
	switch p {
	case GitLab:
		return h.Get(HeaderGitLabToken)
	case GitHub:
		return h.Get(HeaderGitHubSignature)
	case Gitea:
		return h.Get(HeaderGiteaSignature)
	case Forgejo:
		return h.Get(HeaderForgejoSignature)
	}
	return h.Get(HeaderSignature)
}

func verifyOne(p Provider, h http.Header, body, secret []byte) bool {
	switch p {
	case GitLab:
		// Hashing both sides first makes the comparison constant-time in the
		// length too.
		got, want := sha256.Sum256([]byte(h.Get(HeaderGitLabToken))), sha256.Sum256(secret)
		return hmac.Equal(got[:], want[:])
	case GitHub:
		return macMatches(h.Get(HeaderGitHubSignature), "sha256=", body, secret)
	case Gitea:
		return macMatches(h.Get(HeaderGiteaSignature), "", body, secret)
	case Forgejo:
		return macMatches(h.Get(HeaderForgejoSignature), "", body, secret)
	case Generic:
		return macMatches(h.Get(HeaderSignature), "sha256=", body, secret)
	}
	return false
}

func macMatches(header, prefix string, body, secret []byte) bool {
	hexSig, ok := strings.CutPrefix(strings.TrimSpace(header), prefix)
	if !ok {
		return false
	}
	got, err := hex.DecodeString(hexSig)
	if err != nil {
		return false
	}
	return hmac.Equal(got, mac(body, secret))
}

func mac(body, secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return m.Sum(nil)
}

// Sign returns the value of X-Hub-Signature-256 or X-Bex-Signature-256 for body:
// "sha256=<hex>". For clients, tests and the docs' curl line.
func Sign(secret, body []byte) string {
	return "sha256=" + hex.EncodeToString(mac(body, secret))
}
