/* A slot of the event log, as runlog/format.py lays it out (SLOT, "<QBBBBBBHIIQiIqqqqQII",
 * 128 bytes a slot): the byte offsets of its fields, shared by the writer (_fast.c) and
 * the readers' decoder (_decode.c). Change format.py and these together. */
#ifndef DISTDOCTOR_SLOT_LAYOUT_H
#define DISTDOCTOR_SLOT_LAYOUT_H

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the event log is little-endian; this build uses the Python path"
#endif

#define SLOT_SIZE 128
#define OFF_HEAD 128 /* the header's count of events written */
#define S_KIND 8
#define S_STATUS 9
#define S_OP 10
#define S_REDOP 11
#define S_FLAGS 12
#define S_GROUP 16
#define S_CALLSITE 20
#define S_SEQ 24
#define S_PEER 32
#define S_TENSORS 36
#define S_NUMEL_IN 40
#define S_NUMEL_OUT 48
#define S_ENTER 56
#define S_END 64
#define S_SPAN 72
#define S_NAME 80
#define S_ERROR 84

#endif
