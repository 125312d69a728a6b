package agentwire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

// fill sets every field of v to a non-zero value, so a round trip shows any
// field one side lacks.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.Type() == reflect.TypeOf(&time.Time{}) {
			t := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			v.Set(reflect.ValueOf(&t))
			return
		}
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem())
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			fill(v.Field(i))
		}
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0))
		v.Set(s)
	case reflect.String:
		v.SetString("x")
	case reflect.Int64, reflect.Int:
		v.SetInt(7)
	case reflect.Bool:
		v.SetBool(true)
	}
}

// The agent's Inventory is the Agent's status.inventory, field for field.
func TestInventoryMatchesAgentStatus(t *testing.T) {
	var inv Inventory
	fill(reflect.ValueOf(&inv).Elem())
	raw, err := json.Marshal(inv)
	require.NoError(t, err)

	var api v1beta1.HostInventory
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&api), "every field the agent sends is an API field")
	back, err := json.Marshal(api)
	require.NoError(t, err)
	require.JSONEq(t, string(raw), string(back), "and every API field is one the agent sends")
}
