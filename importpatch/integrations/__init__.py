"""Integrations with other systems: the blog-style ``VLLMPatch`` API (``compat``) and vLLM's
``vllm.general_plugins`` entry point (``vllm_plugin``).

Imports the stages and the start-up (``_boot``), never the tools. Runs inside every patched
process: cheap to import, never raises.
"""
