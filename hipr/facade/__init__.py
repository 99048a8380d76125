"""The implementation behind ``from hipr import hip, hiprtc``: hip-python's names, enums and
calling convention over hipr's client.

``hipr/hip.py`` and ``hipr/hiprtc.py`` are the public modules; this package holds what they
share: the enums (:mod:`.enums`), the device pointer (:mod:`.pointer`), the property struct
(:mod:`.props`), kernel argument packing (:mod:`.launch`), the per-process session
(:mod:`.session`), the functions (:mod:`.hip_api`, :mod:`.rtc_api`) and the coverage list
(:mod:`.coverage`). It sits above :mod:`hipr.client`; nothing below imports it.
"""
