"""Subsets of the published CRD schemas of the custom resources the chart can emit.

kubernetes-validate knows only built-in kinds, so these four are checked against the
fields we emit, copied from their CRDs (types, required fields, enums, patterns):
KEDA v2 ``keda.sh_scaledobjects.yaml``, prometheus-operator
``monitoring.coreos.com_servicemonitors.yaml`` and ``..._prometheusrules.yaml``, and
Gateway API v1.1+ standard channel ``gateway.networking.k8s.io_grpcroutes.yaml``.
"""

from __future__ import annotations

from typing import Any, Dict

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_DURATION = {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
# Gateway API's Hostname and SectionName patterns
_HOSTNAME = {"type": "string", "pattern": r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"}
_SECTION = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"}


def _doc(api_version: str, spec: Dict[str, Any]) -> Dict[str, Any]:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"const": api_version}, "spec": spec}}


CRD_SCHEMAS: Dict[str, Dict[str, Any]] = {
    "ScaledObject": _doc("keda.sh/v1alpha1", {
        "type": "object", "required": ["scaleTargetRef", "triggers"], "additionalProperties": False,
        "properties": {
            "scaleTargetRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                               "properties": {"name": {"type": "string"}, "kind": {"type": "string"},
                                              "apiVersion": {"type": "string"}}},
            "minReplicaCount": {"type": "integer"}, "maxReplicaCount": {"type": "integer"},
            "pollingInterval": {"type": "integer"}, "cooldownPeriod": {"type": "integer"},
            "advanced": {"type": "object"},
            "triggers": {"type": "array", "items": {
                "type": "object", "required": ["type", "metadata"], "additionalProperties": False,
                "properties": {"type": {"type": "string"}, "metadata": _STR_MAP,
                               "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                               "name": {"type": "string"}}}},
        }}),
    "ServiceMonitor": _doc("monitoring.coreos.com/v1", {
        "type": "object", "required": ["selector"], "additionalProperties": False,
        "properties": {
            "selector": {"type": "object"},
            "podTargetLabels": {"type": "array", "items": {"type": "string"}},
            "targetLabels": {"type": "array", "items": {"type": "string"}},
            "endpoints": {"type": "array", "items": {
                "type": "object", "additionalProperties": False,
                "properties": {"port": {"type": "string"},
                               "interval": {"type": "string", "pattern": "^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}}}},
        }}),
    "PrometheusRule": _doc("monitoring.coreos.com/v1", {
        "type": "object", "additionalProperties": False,
        "properties": {"groups": {"type": "array", "items": {
            "type": "object", "required": ["name"], "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "minLength": 1}, "interval": _DURATION,
                "rules": {"type": "array", "items": {
                    "type": "object", "required": ["expr"], "additionalProperties": False,
                    "properties": {"alert": {"type": "string"}, "record": {"type": "string"},
                                   "expr": {"type": ["string", "integer"]}, "for": _DURATION,
                                   "keep_firing_for": _DURATION, "labels": _STR_MAP, "annotations": _STR_MAP}}}}}}}}),
    "GRPCRoute": _doc("gateway.networking.k8s.io/v1", {
        "type": "object", "additionalProperties": False,
        "properties": {
            "parentRefs": {"type": "array", "maxItems": 32, "items": {
                "type": "object", "required": ["name"], "additionalProperties": False,
                "properties": {"group": {"type": "string"}, "kind": {"type": "string"}, "name": _NAME,
                               "namespace": {"type": "string", "maxLength": 63}, "sectionName": _SECTION,
                               "port": {"type": "integer", "minimum": 1, "maximum": 65535}}}},
            "hostnames": {"type": "array", "maxItems": 16, "items": _HOSTNAME},
            "rules": {"type": "array", "maxItems": 16, "items": {
                "type": "object", "additionalProperties": False,
                "properties": {
                    "matches": {"type": "array"}, "filters": {"type": "array"},
                    "backendRefs": {"type": "array", "items": {
                        "type": "object", "required": ["name"], "additionalProperties": False,
                        "properties": {"group": {"type": "string"}, "kind": {"type": "string"}, "name": _NAME,
                                       "namespace": {"type": "string"},
                                       "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                                       "weight": {"type": "integer", "minimum": 0}}}}}}},
        }}),
}
