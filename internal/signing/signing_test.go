package signing

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTokens(t *testing.T) {
	k, err := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	tok := k.Token(PurposeImage, "uid-1", "v1")
	require.True(t, k.Verify(tok, PurposeImage, "uid-1", "v1"))
	require.Regexp(t, TokenForm, tok, "servers check a token's form by TokenForm")
	for name, check := range map[string]bool{
		"other uid (recreated object)": k.Verify(tok, PurposeImage, "uid-2", "v1"),
		"other version (stale)":        k.Verify(tok, PurposeImage, "uid-1", "v2"),
		"other purpose":                k.Verify(tok, PurposeRegister, "uid-1", "v1"),
		"tampered":                     k.Verify(tok[:len(tok)-1]+"A", PurposeImage, "uid-1", "v1"),
		"empty":                        k.Verify("", PurposeImage, "uid-1", "v1"),
	} {
		require.False(t, check, name)
	}
	other, _ := NewKey([]byte("fedcba9876543210fedcba9876543210"))
	require.False(t, other.Verify(tok, PurposeImage, "uid-1", "v1"), "another key")
	// Separators keep fields apart: ("ab","c") differs from ("a","bc").
	require.NotEqual(t, k.Token(PurposeImage, "ab", "c"), k.Token(PurposeImage, "a", "bc"))
	_, err = NewKey([]byte("short"))
	require.Error(t, err)
	require.False(t, Key{}.Verify(tok, PurposeImage, "uid-1", "v1"))
}

// Each purpose has its own key: the image service's keys cannot make an
// agent token, and its Secret carries nothing else.
func TestPurposeKeys(t *testing.T) {
	master := []byte("0123456789abcdef0123456789abcdef")
	k, err := NewKey(master)
	require.NoError(t, err)
	agentTok := k.Token(PurposeAgent, "ns/host", "session")
	require.NotEmpty(t, agentTok)
	// A token made with the master key itself (or another purpose's key)
	// is no agent token.
	require.False(t, k.Verify(mac(master, PurposeAgent, "ns/host", "session"), PurposeAgent, "ns/host", "session"))
	require.False(t, k.Verify(k.Token(PurposeImage, "ns/host", "session"), PurposeAgent, "ns/host", "session"))

	sec := DerivedSecret(k, "agentboot-system", ImageServiceSecretName, ImageServicePurposes)
	require.ElementsMatch(t, []string{PurposeImage, PurposeRegister}, keysOf(sec.Data))
	for _, v := range sec.Data {
		require.NotContains(t, string(v), string(master))
	}
	img, err := FromDerived(sec.Data, ImageServicePurposes, "test")
	require.NoError(t, err)
	require.Equal(t, "", img.Token(PurposeAgent, "ns/host", "session"), "the image service cannot mint agent tokens")
	require.False(t, img.Verify(agentTok, PurposeAgent, "ns/host", "session"))
	require.Equal(t, k.Token(PurposeImage, "uid", "v1"), img.Token(PurposeImage, "uid", "v1"))
	require.Equal(t, k.RegistrationToken("uid", ""), img.RegistrationToken("uid", ""))
	restricted := k.Only(ImageServicePurposes...)
	require.Equal(t, "", restricted.Token(PurposeAgent, "ns/host", "session"))

	sec.Data[PurposeRegister] = []byte("short")
	_, err = FromDerived(sec.Data, ImageServicePurposes, "test")
	require.ErrorContains(t, err, `key "register" is 5 bytes`)
}

// Registration tokens: a rotation gives a new token and retires the old;
// nothing signed with the master key itself verifies.
func TestRegistrationTokens(t *testing.T) {
	master := []byte("0123456789abcdef0123456789abcdef")
	k, err := NewKey(master)
	require.NoError(t, err)
	tok := k.RegistrationToken("uid-1", "")
	epoch, ok := k.VerifyRegistration(tok, "uid-1")
	require.True(t, ok)
	require.Equal(t, "", epoch)
	_, ok = k.VerifyRegistration(tok, "uid-2")
	require.False(t, ok, "another InfraEnv")

	e := Epoch("2026-11-25")
	require.Len(t, e, 12)
	rotated := k.RegistrationToken("uid-1", e)
	require.NotEqual(t, tok, rotated)
	epoch, ok = k.VerifyRegistration(rotated, "uid-1")
	require.True(t, ok)
	require.Equal(t, e, epoch)
	_, ok = k.VerifyRegistration(Epoch("other")+rotated[len(e):], "uid-1")
	require.False(t, ok, "an epoch swapped in the token")
	_, ok = k.VerifyRegistration("."+tok, "uid-1")
	require.False(t, ok)

	// Nothing made with the master key itself verifies: keys are derived
	// per purpose (an earlier draft signed with the master key; it never
	// shipped, and its tokens are not honoured).
	_, ok = k.VerifyRegistration(mac(master, PurposeRegister, "uid-1", ""), "uid-1")
	require.False(t, ok, "a registration token made with the master key")
	require.False(t, k.Verify(mac(master, PurposeAgent, "uid-1", "v"), PurposeAgent, "uid-1", "v"), "an agent token made with the master key")
	require.False(t, k.Verify(mac(master, PurposeImage, "uid-1", "v"), PurposeImage, "uid-1", "v"), "an image URL made with the master key")
}

func keysOf(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A boot proof holds for one BareMetalHost, one boot (its nonce) and until
// it expires; nothing of it can be changed.
func TestBootProof(t *testing.T) {
	k, err := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	nonce := NewBootNonce()
	require.NotEqual(t, nonce, NewBootNonce())
	p := k.BootProof("ns", "bmh", "uid-1", nonce, now.Add(time.Hour))
	got, err := k.CheckBootProof(p, "ns", "bmh", "uid-1", now)
	require.NoError(t, err)
	require.Equal(t, nonce, got)
	parts := strings.SplitN(p, ".", 3)
	for name, c := range map[string]struct {
		proof, ns, name, uid string
		at                   time.Time
		want                 string
	}{
		"expired":              {p, "ns", "bmh", "uid-1", now.Add(time.Hour), "expired"},
		"recreated host":       {p, "ns", "bmh", "uid-2", now, "does not hold"},
		"another host":         {p, "ns", "other", "uid-1", now, "does not hold"},
		"another namespace":    {p, "ns2", "bmh", "uid-1", now, "does not hold"},
		"expiry moved on":      {parts[0] + "." + strconv.FormatInt(now.Add(48*time.Hour).Unix(), 10) + "." + parts[2], "ns", "bmh", "uid-1", now, "does not hold"},
		"another boot's nonce": {NewBootNonce() + "." + parts[1] + "." + parts[2], "ns", "bmh", "uid-1", now, "does not hold"},
		"malformed":            {"AAAA" + p, "ns", "bmh", "uid-1", now, "not a boot proof"},
		"empty":                {"", "ns", "bmh", "uid-1", now, "not a boot proof"},
	} {
		_, err := k.CheckBootProof(c.proof, c.ns, c.name, c.uid, c.at)
		require.ErrorContains(t, err, c.want, name)
	}
	require.Empty(t, Key{}.BootProof("ns", "bmh", "uid-1", nonce, now), "no key, no proof")
}

// The agent API's keys: everything but the image key; they seal and open
// what the manager hands over, and a sealed message opens only for the
// aad it was sealed with, under the key it was sealed with, unaltered.
func TestAgentAPIKeysAndSeals(t *testing.T) {
	k, err := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	sec := DerivedSecret(k, "agentboot-system", AgentAPISecretName, AgentAPIPurposes)
	require.NotContains(t, keysOf(sec.Data), PurposeImage)
	api, err := FromDerived(sec.Data, AgentAPIPurposes, "test")
	require.NoError(t, err)
	require.Equal(t, "", api.Token(PurposeImage, "uid", "v1"), "the agent API cannot sign image URLs")
	require.Equal(t, k.Token(PurposeAgent, "ns/host", "s"), api.Token(PurposeAgent, "ns/host", "s"))
	require.NotEqual(t, k.Fingerprint(), api.Fingerprint())
	require.Equal(t, api.Fingerprint(), k.Only(AgentAPIPurposes...).Fingerprint())

	sealed, err := k.Seal([]byte("join token"), []byte("agent-uid-1"))
	require.NoError(t, err)
	require.NotContains(t, string(sealed), "join token")
	again, err := k.Seal([]byte("join token"), []byte("agent-uid-1"))
	require.NoError(t, err)
	require.NotEqual(t, sealed, again, "a fresh nonce every time")
	got, err := api.Open(sealed, []byte("agent-uid-1"))
	require.NoError(t, err)
	require.Equal(t, "join token", string(got))

	other, _ := NewKey([]byte("fedcba9876543210fedcba9876543210"))
	flipped := append([]byte(nil), sealed...)
	flipped[len(flipped)-1] ^= 1
	for name, try := range map[string]func() ([]byte, error){
		"another aad": func() ([]byte, error) { return api.Open(sealed, []byte("agent-uid-2")) },
		"another key": func() ([]byte, error) { return other.Open(sealed, []byte("agent-uid-1")) },
		"altered":     func() ([]byte, error) { return api.Open(flipped, []byte("agent-uid-1")) },
		"cut short":   func() ([]byte, error) { return api.Open(sealed[:10], []byte("agent-uid-1")) },
		"empty":       func() ([]byte, error) { return api.Open(nil, []byte("agent-uid-1")) },
	} {
		_, err := try()
		require.ErrorIs(t, err, ErrSealBroken, name)
	}
	img := k.Only(ImageServicePurposes...)
	_, err = img.Seal([]byte("x"), nil)
	require.ErrorContains(t, err, "cannot seal", "the image service holds no seal key")
}

// An agent API running apart reads its keys from the files the kubelet
// mounts its Secret as, and notices when they change.
func TestKeeperReadsMountedKeys(t *testing.T) {
	k, err := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	dir := t.TempDir()
	keeper := &Keeper{Dir: dir}
	keeper.init()
	keeper.refresh(context.Background())
	_, err = keeper.Key()
	require.ErrorIs(t, err, ErrNoKey, "nothing mounted yet")
	_, _, err = keeper.load(context.Background())
	require.ErrorContains(t, err, AgentAPISecretName)

	// As the kubelet mounts a Secret: each version in a directory of its
	// own, ..data pointing at the current one, each key a link through it.
	version := 0
	write := func(k Key) {
		version++
		v := fmt.Sprintf("..v%d", version)
		require.NoError(t, os.Mkdir(filepath.Join(dir, v), 0o700))
		for p, b := range DerivedSecret(k, "ns", AgentAPISecretName, AgentAPIPurposes).Data {
			require.NoError(t, os.WriteFile(filepath.Join(dir, v, p), b, 0o400))
			if _, err := os.Lstat(filepath.Join(dir, p)); err != nil {
				require.NoError(t, os.Symlink(filepath.Join("..data", p), filepath.Join(dir, p)))
			}
		}
		require.NoError(t, os.Symlink(v, filepath.Join(dir, "..data_tmp")))
		require.NoError(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	}
	write(k)
	keeper.refresh(context.Background())
	got, err := keeper.Key()
	require.NoError(t, err)
	require.Equal(t, k.Only(AgentAPIPurposes...).Fingerprint(), got.Fingerprint())
	select {
	case <-keeper.Changes():
	default:
		t.Fatal("no change announced for the first key")
	}

	other, _ := NewKey([]byte("fedcba9876543210fedcba9876543210"))
	write(other)
	keeper.refresh(context.Background())
	got, _ = keeper.Key()
	require.Equal(t, other.Only(AgentAPIPurposes...).Fingerprint(), got.Fingerprint())
	select {
	case <-keeper.Changes():
	default:
		t.Fatal("no change announced for a replaced key")
	}

	// A damaged file leaves the last good key in use.
	require.NoError(t, os.Chmod(filepath.Join(dir, "..v2", PurposeAgent), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "..v2", PurposeAgent), []byte("short"), 0o600))
	keeper.refresh(context.Background())
	got, _ = keeper.Key()
	require.Equal(t, other.Only(AgentAPIPurposes...).Fingerprint(), got.Fingerprint())
}
