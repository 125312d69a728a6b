// Package signing makes and checks the tokens that guard agentboot's URLs and
// APIs. A token is an HMAC-SHA256 of the UID of the object it is bound to
// and a version, under a key for its purpose; deleting and recreating an
// object (a new UID) or changing its content (a new version) invalidates
// its tokens. The purposes' keys are derived from one master key in a
// Secret only the manager reads; the image service gets the image and
// registration keys alone, in a Secret of their own, so that it cannot
// mint agent tokens; the agent API gets its own (every key but the image
// key), mounted as files, so that it needs no right to read Secrets.
package signing

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

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
	// PurposeIdentity keys the digests of what hosts say they are.
	PurposeIdentity = "host-identity"
	// PurposeBootProof proves that a host booted from the virtual media
	// the BMC controller inserted for one BareMetalHost.
	PurposeBootProof = "bmh-boot"
	// PurposeInstallSeal seals what the manager hands the agent API for a
	// bound host's installation (its cluster's join token).
	PurposeInstallSeal = "install-seal"
)

// purposes are all the keys derived from the master key.
var purposes = []string{PurposeImage, PurposeRegister, PurposeAgent, PurposeIdentity, PurposeBootProof, PurposeInstallSeal}

// AgentAPIPurposes are the keys the agent API holds: it verifies
// registration tokens and boot proofs, signs agent tokens and identity
// digests, and opens sealed installations. It never signs image URLs.
var AgentAPIPurposes = []string{PurposeRegister, PurposeAgent, PurposeIdentity, PurposeBootProof, PurposeInstallSeal}

// ImageServicePurposes are the keys the image service holds: it signs and
// checks image URLs and embeds registration tokens in discovery content.
var ImageServicePurposes = []string{PurposeImage, PurposeRegister}

// Secrets holding keys.
const (
	// SecretName holds the master key; only the manager reads it.
	SecretName = "agentboot-signing-key"
	// ImageServiceSecretName holds the image service's derived keys; the
	// manager writes it.
	ImageServiceSecretName = "agentboot-image-service-keys"
	// AgentAPISecretName holds the agent API's derived keys; the manager
	// writes it and the kubelet mounts it into the agent API's pods.
	AgentAPISecretName = "agentboot-agent-api-keys"
	secretKey          = "key"
	keyLen             = 32
)

// Key signs and verifies tokens, with one derived key per purpose it holds.
type Key struct {
	sub map[string][]byte
}

// NewKey derives every purpose's key from the master key raw.
func NewKey(raw []byte) (Key, error) {
	if len(raw) < keyLen {
		return Key{}, fmt.Errorf("signing key is %d bytes, want at least %d", len(raw), keyLen)
	}
	k := Key{sub: map[string][]byte{}}
	for _, p := range purposes {
		k.sub[p] = derive(raw, p)
	}
	return k, nil
}

func derive(master []byte, purpose string) []byte {
	m := hmac.New(sha256.New, master)
	m.Write([]byte("agentboot purpose key\x00" + purpose))
	return m.Sum(nil)
}

// Only returns a Key holding only the given purposes' keys (and not the
// master key).
func (k Key) Only(purposes ...string) Key {
	out := Key{sub: map[string][]byte{}}
	for _, p := range purposes {
		if v, ok := k.sub[p]; ok {
			out.sub[p] = v
		}
	}
	return out
}

// Has reports whether the Key can sign for purpose.
func (k Key) Has(purpose string) bool { return len(k.sub[purpose]) >= keyLen }

// Valid reports whether the key was loaded.
func (k Key) Valid() bool { return len(k.sub) > 0 }

// Token binds uid and version under purpose's key; "" when the Key does
// not hold that purpose.
func (k Key) Token(purpose, uid, version string) string {
	if !k.Has(purpose) {
		return ""
	}
	return mac(k.sub[purpose], purpose, uid, version)
}

func mac(key []byte, parts ...string) string {
	m := hmac.New(sha256.New, key)
	for _, part := range parts {
		m.Write([]byte(part))
		m.Write([]byte{0})
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// TokenForm is the form of every Token: an HMAC-SHA256, base64url without
// padding. Servers refuse anything else before they look further.
var TokenForm = regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)

// Verify checks token in constant time.
func (k Key) Verify(token, purpose, uid, version string) bool {
	if token == "" || uid == "" {
		return false
	}
	want := k.Token(purpose, uid, version)
	return want != "" && hmac.Equal([]byte(token), []byte(want))
}

// Source gives the current Key.
type Source interface {
	Key() (Key, error)
}

// Restricted is a Source giving only some purposes' keys of another.
type Restricted struct {
	Source   Source
	Purposes []string
}

// Key returns the restricted Key.
func (r Restricted) Key() (Key, error) {
	k, err := r.Source.Key()
	if err != nil {
		return Key{}, err
	}
	return k.Only(r.Purposes...), nil
}

// DerivedSecret is the Secret name holding k's keys of purposes, one data
// key per purpose.
func DerivedSecret(k Key, namespace, name string, purposes []string) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{"app.kubernetes.io/part-of": "agentboot"}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{},
	}
	for _, p := range purposes {
		s.Data[p] = append([]byte(nil), k.sub[p]...)
	}
	return s
}

// FromDerived reads the keys of purposes from data (a derived Secret's, or
// its files as the kubelet mounts them); where names the source in errors.
func FromDerived(data map[string][]byte, purposes []string, where string) (Key, error) {
	k := Key{sub: map[string][]byte{}}
	for _, p := range purposes {
		if len(data[p]) != keyLen {
			return Key{}, fmt.Errorf("%s: key %q is %d bytes, want %d", where, p, len(data[p]), keyLen)
		}
		k.sub[p] = append([]byte(nil), data[p]...)
	}
	return k, nil
}

// Fingerprint tells keys apart without revealing them: equal for equal
// keys, different (but for a hash collision) otherwise.
func (k Key) Fingerprint() string {
	m := sha256.New()
	for _, p := range purposes {
		m.Write([]byte(p + "\x00"))
		m.Write(k.sub[p])
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil)[:8])
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

// RotateAnnotation on an InfraEnv rotates its registration token: any new
// value gives a new token (and so new discovery content and URLs), and the
// tokens of earlier values, in discovery images already made, stop
// registering hosts. Agents already registered are not affected.
const RotateAnnotation = "agentboot.io/rotate-registration-token"

// Epoch names a rotation value in tokens: "" for none.
func Epoch(rotation string) string {
	if rotation == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(rotation))
	return hex.EncodeToString(sum[:6])
}

// RegistrationToken is the token hosts of the InfraEnv uid register with,
// at rotation epoch. The epoch travels in the token, so that it can be
// checked before anything is read.
func (k Key) RegistrationToken(uid, epoch string) string {
	t := k.Token(PurposeRegister, uid, epoch)
	if t == "" || epoch == "" {
		return t
	}
	return epoch + "." + t
}

// VerifyRegistration checks a registration token for the InfraEnv uid and
// returns the epoch it was made at.
func (k Key) VerifyRegistration(token, uid string) (epoch string, ok bool) {
	mac := token
	if i := strings.LastIndexByte(token, '.'); i >= 0 {
		epoch, mac = token[:i], token[i+1:]
		if epoch == "" {
			return "", false
		}
	}
	return epoch, k.Verify(mac, PurposeRegister, uid, epoch)
}

// BootProof is what the ISO inserted through the BMC of the BareMetalHost
// ns/name (UID uid) for one boot carries, so that the host booted from it
// can show it did: a host on the boot network never sees it (the BMC
// fetches the ISO), and only the manager can make or check one. It names
// the boot by its nonce (which the BMC controller records on the host as
// BootNonceAnnotation when it sends the boot) and holds until expires:
// whoever reads it from the BareMetalHost's status later has nothing.
// Format: nonce "." expiry (Unix seconds) "." MAC.
func (k Key) BootProof(ns, name, uid, nonce string, expires time.Time) string {
	exp := strconv.FormatInt(expires.Unix(), 10)
	t := k.Token(PurposeBootProof, ns+"/"+name, uid+"\n"+nonce+"\n"+exp)
	if t == "" {
		return ""
	}
	return nonce + "." + exp + "." + t
}

// BootNonceAnnotation on a BareMetalHost is the nonce of the boot into
// discovery its BMC controller sent last: only a proof of that boot holds.
const BootNonceAnnotation = "agentboot.io/boot-nonce"

// BootProofPattern is the shape of a boot proof.
var BootProofPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{22}\.[0-9]{1,12}\.[A-Za-z0-9_-]{43}$`)

// NewBootNonce is a new boot's nonce: 128 random bits.
func NewBootNonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// CheckBootProof returns the nonce of proof if it is a boot proof for the
// BareMetalHost ns/name (UID uid) that has not expired at now, or why not.
func (k Key) CheckBootProof(proof, ns, name, uid string, now time.Time) (string, error) {
	if !BootProofPattern.MatchString(proof) {
		return "", errors.New("not a boot proof")
	}
	parts := strings.SplitN(proof, ".", 3)
	nonce, exp, token := parts[0], parts[1], parts[2]
	if !k.Verify(token, PurposeBootProof, ns+"/"+name, uid+"\n"+nonce+"\n"+exp) {
		return "", errors.New("does not hold (a forgery, or a BareMetalHost recreated since)")
	}
	sec, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || !now.Before(time.Unix(sec, 0)) {
		return "", fmt.Errorf("expired at %s", time.Unix(sec, 0).UTC().Format(time.RFC3339))
	}
	return nonce, nil
}

// sealNonce is the size of a sealed message's random nonce (AES-GCM's).
const sealNonce = 12

// Seal encrypts and authenticates plaintext under the install-seal key
// (AES-256-GCM with a random nonce); aad, authenticated but not
// encrypted, binds the message to what it is for, so that it opens for
// nothing else.
func (k Key) Seal(plaintext, aad []byte) ([]byte, error) {
	aead, err := k.sealer()
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, sealNonce, sealNonce+len(plaintext)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return aead.Seal(nonce, nonce, plaintext, aad), nil
}

// ErrSealBroken is Open's error for a message that is not one Seal made
// with this key and aad: tampered with, made for something else, or sealed
// under a key since replaced.
var ErrSealBroken = errors.New("sealed message does not open: altered, made for something else, or sealed under another key")

// Open returns what Seal sealed with the same key and aad.
func (k Key) Open(sealed, aad []byte) ([]byte, error) {
	aead, err := k.sealer()
	if err != nil {
		return nil, err
	}
	if len(sealed) < sealNonce+aead.Overhead() {
		return nil, ErrSealBroken
	}
	out, err := aead.Open(nil, sealed[:sealNonce], sealed[sealNonce:], aad)
	if err != nil {
		return nil, ErrSealBroken
	}
	return out, nil
}

func (k Key) sealer() (cipher.AEAD, error) {
	if !k.Has(PurposeInstallSeal) {
		return nil, fmt.Errorf("this key cannot seal or open (no %q key)", PurposeInstallSeal)
	}
	// A key of its own for the cipher: the purpose's key also makes
	// digests (Token), and one key serves one primitive.
	m := hmac.New(sha256.New, k.sub[PurposeInstallSeal])
	m.Write([]byte("agentboot seal aes-256-gcm"))
	block, err := aes.NewCipher(m.Sum(nil))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
