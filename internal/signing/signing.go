// Package signing makes and checks the tokens that guard agentboot's URLs and
// APIs. A token is an HMAC-SHA256, under one cluster-wide key, of a purpose,
// the UID of the object it is bound to, and a version; deleting and
// recreating an object (a new UID) or changing its content (a new version)
// invalidates its tokens. The key lives in a Secret the manager creates.
package signing

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Token purposes.
const (
	// PurposeImage guards the image service's per-InfraEnv URLs.
	PurposeImage = "image"
	// PurposeRegister lets a host register into an InfraEnv.
	PurposeRegister = "register"
	// PurposeAgent lets a registered host act on its own Agent.
	PurposeAgent = "agent"
)

// Secret holding the key.
const (
	SecretName = "agentboot-signing-key"
	secretKey  = "key"
	keyLen     = 32
)

// Key signs and verifies tokens.
type Key struct{ k []byte }

// NewKey wraps raw key bytes.
func NewKey(raw []byte) (Key, error) {
	if len(raw) < keyLen {
		return Key{}, fmt.Errorf("signing key is %d bytes, want at least %d", len(raw), keyLen)
	}
	return Key{k: append([]byte(nil), raw...)}, nil
}

// Valid reports whether the key was loaded.
func (k Key) Valid() bool { return len(k.k) >= keyLen }

// Token binds purpose, uid and version.
func (k Key) Token(purpose, uid, version string) string {
	m := hmac.New(sha256.New, k.k)
	for _, part := range []string{purpose, uid, version} {
		m.Write([]byte(part))
		m.Write([]byte{0})
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Verify checks token in constant time.
func (k Key) Verify(token, purpose, uid, version string) bool {
	if !k.Valid() || token == "" || uid == "" {
		return false
	}
	return hmac.Equal([]byte(token), []byte(k.Token(purpose, uid, version)))
}

// FromSecret reads the key from the Secret's data.
func FromSecret(s *corev1.Secret) (Key, error) {
	return NewKey(s.Data[secretKey])
}

// Ensure returns the key, creating the Secret in namespace on first use when
// w is not nil. Concurrent managers agree: only one Create succeeds and the
// others read what it wrote.
func Ensure(ctx context.Context, r client.Reader, w client.Writer, namespace string) (Key, error) {
	var s corev1.Secret
	err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: SecretName}, &s)
	if err == nil {
		return FromSecret(&s)
	}
	if !apierrors.IsNotFound(err) || w == nil {
		return Key{}, fmt.Errorf("read signing key %s/%s: %w", namespace, SecretName, err)
	}
	raw := make([]byte, keyLen)
	if _, err := rand.Read(raw); err != nil {
		return Key{}, err
	}
	s = corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: SecretName, Labels: map[string]string{"app.kubernetes.io/part-of": "agentboot"}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{secretKey: raw},
	}
	if err := w.Create(ctx, &s); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return Ensure(ctx, r, nil, namespace)
		}
		return Key{}, fmt.Errorf("create signing key %s/%s: %w", namespace, SecretName, err)
	}
	return NewKey(raw)
}

// ErrNoKey is returned while the key is not yet known.
var ErrNoKey = errors.New("signing key not loaded yet")
