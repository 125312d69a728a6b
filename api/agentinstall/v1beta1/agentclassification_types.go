package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AgentClassification conditions and their reasons (assisted-service's).
const (
	// QueryValidCondition says whether the query compiles.
	QueryValidCondition ConditionType = "QueryValid"
	QueryValidReason                  = "QueryIsValid"
	QueryNotValidReason               = "QueryIsNotValid"
	// QueryErrorsCondition is True while the query fails on some Agent.
	QueryErrorsCondition ConditionType = "QueryErrors"
	QueryNoErrorsReason                = "NoQueryErrors"
	QueryHasErrorsReason               = "HasQueryErrors"
)

// ClassificationLabelPrefix prefixes the label key an AgentClassification
// puts on the Agents it matches.
const ClassificationLabelPrefix = "agentclassification.agent-install.openshift.io/"

// ClassificationQueryErrorPrefix prefixes the label value an Agent gets
// when the query fails on its inventory.
const ClassificationQueryErrorPrefix = "QUERYERROR-"

// AgentClassificationSpec is a label and the query over an Agent's
// inventory that decides which Agents of the namespace get it.
type AgentClassificationSpec struct {
	// LabelKey is the label's name after the
	// agentclassification.agent-install.openshift.io/ prefix.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="labelKey is immutable"
	LabelKey string `json:"labelKey"`

	// LabelValue is the label's value on matching Agents (an Agent whose
	// inventory the query fails on gets QUERYERROR-<labelValue>).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=52
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="labelValue is immutable"
	LabelValue string `json:"labelValue"`

	// Query is a jq program (gojq's dialect) run on each Agent's
	// status.inventory; the Agents for which it gives true get the label.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Query string `json:"query"`
}

// AgentClassificationStatus says how many Agents the classification
// matches and whether its query works.
type AgentClassificationStatus struct {
	// MatchedCount is how many Agents of the namespace have the label.
	// +optional
	MatchedCount int `json:"matchedCount,omitempty"`
	// ErrorCount is how many Agents the query failed on.
	// +optional
	ErrorCount int `json:"errorCount,omitempty"`
	// Conditions: QueryValid, QueryErrors.
	// +optional
	Conditions []Condition `json:"conditions,omitempty"`
}

// AgentClassification labels the Agents of its namespace whose inventory
// a query matches, so that a NodePool's agentLabelSelector can pick hosts
// by their hardware.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Label",type=string,JSONPath=`.spec.labelKey`
// +kubebuilder:printcolumn:name="Value",type=string,JSONPath=`.spec.labelValue`
// +kubebuilder:printcolumn:name="Matched",type=integer,JSONPath=`.status.matchedCount`
// +kubebuilder:printcolumn:name="Errors",type=integer,JSONPath=`.status.errorCount`
type AgentClassification struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the label and its query.
	Spec AgentClassificationSpec `json:"spec,omitempty"`
	// Status is what agentboot found.
	// +optional
	Status AgentClassificationStatus `json:"status,omitempty"`
}

// AgentClassificationList is a list of AgentClassifications.
//
// +kubebuilder:object:root=true
type AgentClassificationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AgentClassification `json:"items"`
}
